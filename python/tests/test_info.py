"""attn.info(): which kernels this CPU runs, as `attn info` prints it (include/attn/info.hpp)."""
import attn


def test_info_names_the_simd_target_and_the_amx_path(monkeypatch):
    i = attn.info()
    assert set(i) == {"simd", "amx", "amx_reason", "f16_on_tiles", "f32_on_tiles", "bf16_dots", "quantized_query",
                      "summary"}
    assert i["summary"].startswith("SIMD " + i["simd"])
    assert i["amx"] in ("hardware", "emulated", "none")
    assert isinstance(i["bf16_dots"], bool) and i["amx_reason"]
    assert isinstance(i["quantized_query"], bool)
    assert ("quantized_query" in i["summary"]) == i["quantized_query"]
    assert isinstance(i["f16_on_tiles"], bool)
    monkeypatch.setenv("ATTN_AMX", "emulate")  # read at every call
    assert attn.info()["amx"] == "emulated" and "AMX emulator" in attn.info()["summary"]
    assert attn.info()["f16_on_tiles"] and "f16 forward and backward on the tiles" in attn.info()["summary"]
    assert not attn.info()["f32_on_tiles"]  # opt-in: ATTN_AMX_F32=bf16x3
    monkeypatch.setenv("ATTN_AMX_F32", "bf16x3")
    assert attn.info()["f32_on_tiles"] and "f32 forward on the tiles as bf16x3" in attn.info()["summary"]
    monkeypatch.setenv("ATTN_AMX", "off")
    assert attn.info()["amx"] == "none" and "AMX" not in attn.info()["summary"]
    assert not attn.info()["f16_on_tiles"] and not attn.info()["f32_on_tiles"]


def test_info_with_amx_forced_where_it_cannot_run_raises_the_reason(monkeypatch):
    monkeypatch.setenv("ATTN_AMX", "on")
    try:
        i = attn.info()
    except attn.AttnError as e:  # no usable AMX here: the reason, by name
        assert "ATTN_AMX=on" in str(e)
    else:
        assert i["amx"] == "hardware"
