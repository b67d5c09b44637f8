// `attn bench prefill|decode|backward`: the performance tables. Each subcommand lives in its own file.
#include <CLI/CLI.hpp>

#include <cstdlib>

#include "bench_isa.hpp"
#include "commands.hpp"
#include "cpu/dpbf16.hpp"

namespace attn::cli {

void add_bench_command(CLI::App& app) {
  auto* bench = app.add_subcommand("bench", "Benchmarks against the machine's measured ceilings and baselines");
  bench->require_subcommand(1);
  bench->fallthrough();  // --isa also after the subcommand's name
  bench
      ->add_option_function<std::string>("--isa", pin_isa,
                                         "run every kernel and the FMA probe on these Highway targets only "
                                         "(comma-separated, e.g. avx2 on an AVX-512 machine; as ATTN_ISA)")
      ->type_name("TARGETS");
  bench
      ->add_option_function<std::string>(
          "--bf16-dots", [](const std::string& v) { detail::force_bf16_dots(v == "on"    ? 1
                                                                            : v == "off" ? 0
                                                                                         : -1); },
          "bf16 kernels on VDPBF16PS (on) or widened to f32 FMAs (off), on CPUs with AVX512-BF16; "
          "auto: where it pays (as ATTN_BF16_DOTS; docs/prefill.md)")
      ->check(CLI::IsMember({"on", "off", "auto"}))
      ->type_name("on|off|auto");
  bench
      ->add_option_function<std::string>(
          "--amx", [](const std::string& v) { setenv("ATTN_AMX", v.c_str(), 1); },
          "bf16 forward, backward and wide decode (MLA) on AMX tiles (on: insist, a named error where AMX cannot run), "
          "on the "
          "vector kernels "
          "(off), where usable (auto), or on the tile emulator (emulate); as ATTN_AMX (docs/prefill.md)")
      ->check(CLI::IsMember({"on", "off", "auto", "emulate"}))
      ->type_name("on|off|auto|emulate");
  add_bench_prefill(*bench);
  add_bench_decode(*bench);
  add_bench_mla(*bench);
  add_bench_ring(*bench);
  add_bench_backward(*bench);
}

}  // namespace attn::cli
