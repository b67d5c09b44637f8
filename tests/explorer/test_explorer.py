#!/usr/bin/env python3
"""The explorer page in headless Chromium against the CLI (docs/explorer.md).

Serves the built page with `attn explore --port 0`, opens it at a phone's width in drive mode
(index.html#drive: every slider moved through every position by input events, the shown figures
logged into the DOM), dumps the DOM, and compares each logged figure with `attn io --json`,
`attn check tiled --json` and `attn check splitk --json` for the same inputs. Then takes a screenshot
at the defaults (the test's artefact). Python's standard library only.

Exit 0 passed, 1 failed, 77 skipped (no Chromium, or no WebAssembly build): ctest's SKIP_RETURN_CODE.
"""
import argparse
import html
import json
import math
import os
import re
import shutil
import subprocess
import sys
import tempfile

SKIP = 77
failures = []
tiled_pairs = {}  # tile -> (page's max |Δ|, the CLI's), printed at the end


def check(ok, what):
    if not ok:
        failures.append(what)


def mb(b):  # attn::cli::format_mb
    return "%.1f MB" % (b / 1e6)


def seconds(s):  # attn::cli::format_seconds
    if s < 1e-3:
        return "%.1f µs" % (s * 1e6)
    return "%.2f ms" % (s * 1e3) if s < 1 else "%.3f s" % s


def kib(b):  # attn::cli::format_bytes
    if b < 1024:
        return "%.0f B" % b
    if b < 1024 * 1024:
        return "%.1f KiB" % (b / 1024)
    return "%.1f MiB" % (b / 1048576) if b < 1024**3 else "%.2f GiB" % (b / 1024**3)


def ratio(r):  # `attn io`'s reduction
    return ("%.1f×" % r) if r >= 1 else ("%.2g×" % r)


class Cli:
    def __init__(self, exe):
        self.exe, self.cache = exe, {}

    def json(self, *args):
        if args not in self.cache:
            out = subprocess.run([self.exe, *args], capture_output=True, text=True, timeout=300)
            if out.returncode != 0:
                raise RuntimeError("attn %s: exit %d: %s" % (" ".join(args), out.returncode, out.stderr.strip()))
            self.cache[args] = json.loads(out.stdout)
        return self.cache[args]

    def io(self, t, sram=None, count=False):
        args = ["io", "--json", "--seq", str(t["seq"]), "--head-dim", str(t["d"]),
                "--sram", str(t["sram"] if sram is None else sram), "--bytes", str(t["elem"]),
                "--bandwidth", repr(float(t["bw"])), "--derate", repr(float(t["derate"]))]
        return self.json(*(args + (["--count"] if count else [])))


def check_traffic(cli, rec):
    t, s = rec["traffic"], rec["shown"]
    r = cli.io(t)
    where = "%s moved, %s" % (rec["moved"], t)
    check(s["seq-out"] == "{:,}".format(t["seq"]) and s["d-out"] == str(t["d"]), "inputs shown: " + where)
    for name, key in (("std", "standard"), ("tiled", "tiled"), ("fa2", "fa2")):
        check(s[name + "-bytes"] == mb(r[key]["bytes"]), "%s bytes %r vs %r: %s" % (key, s[name + "-bytes"], mb(r[key]["bytes"]), where))
        check(s[name + "-time"] == seconds(r[key]["seconds"]), "%s time %r: %s" % (key, s[name + "-time"], where))
    check(s["reduction"] == ratio(r["reduction"]), "reduction %r vs %r: %s" % (s["reduction"], ratio(r["reduction"]), where))
    check(s["nxn"] == mb(r["score_matrix_bytes"]), "N×N %r: %s" % (s["nxn"], where))
    # Break-even: the shown SRAM is where `attn io` says tiling starts to win, and one element less it does not.
    for k, (key, name) in enumerate((("tiled", "be-tiled"), ("fa2", "be-fa2"))):
        m = s["break_even_elements"][k]
        if m == 0:
            check(s[name] == "never", "break-even %s: %s" % (key, where))
            continue
        check(s[name] == kib(m * t["elem"]), "break-even %s text %r: %s" % (key, s[name], where))
        check(cli.io(t, sram=m * t["elem"])[key]["bytes"] < r["standard"]["bytes"], "break-even %s wins: %s" % (key, where))
        if m > 1:
            check(cli.io(t, sram=(m - 1) * t["elem"])[key]["bytes"] >= r["standard"]["bytes"],
                  "break-even %s is the step: %s" % (key, where))


def check_tiled(cli, s):
    tile = s["tile-out"]
    r = cli.json("check", "tiled", "--tile", tile, "--json")
    m = re.fullmatch(r"48 queries × 48 keys, d = 16, tiles of (\d+): tiled vs textbook, max \|Δ\| = (\S+) \(exact\)",
                     s["tiled-check"])
    check(m is not None and m.group(1) == tile, "tiled check text: %r" % s["tiled-check"])
    if m:
        # Same data and the same kernel, but compiled for Highway's EMU128 in the page and for this CPU's
        # SIMD target natively, so the last bits of rounding may differ: both must be exact (<= 1e-12).
        shown = float(m.group(2))
        tiled_pairs[int(tile)] = (m.group(2), "%.1e" % r["max_abs_diff"])
        check(shown <= r["tolerance"] and r["passed"], "tiled exact: page %g, CLI %g" % (shown, r["max_abs_diff"]))


def check_splitk(cli, s):
    w = s["workers-out"]
    r = cli.json("check", "splitk", "--workers", w, "--json")
    m = re.fullmatch(r"One query over 4,096 keys, merged from (\S+) partials: max \|Δ\| = (\S+) \(exact\)", s["splitk-check"])
    check(m is not None and m.group(1) == "{:,}".format(int(w)), "split-K text: %r" % s["splitk-check"])
    if m:
        check(float(m.group(2)) <= r["tolerance"] and r["passed"], "split-K exact: %r" % s["splitk-check"])
    want = ["#%d: m=%.2f l=%.1f (%s keys)" % (i, p["m"], p["l"], "{:,}".format(p["keys"])) if p["m"] is not None
            else "#%d: empty slice (m=-inf l=0)" % i for i, p in enumerate(r["partials"])]
    check(s["partials"] == want, "split-K partials (W=%s): %r vs %r" % (w, s["partials"], want))
    # The merge of the CLI's partials, by the rule in the specification: m = max m_i, l = sum l_i e^(m_i - m).
    mm = max(p["m"] for p in r["partials"] if p["m"] is not None)
    ll = sum(p["l"] * math.exp(p["m"] - mm) for p in r["partials"] if p["m"] is not None)
    check(s["merged"] == "Merged: m=%.2f l=%.1f" % (mm, ll), "merged (W=%s): %r" % (w, s["merged"]))


def check_decode(rec):
    d, s = rec["decode"], rec["shown"]
    kv = 2.0 * d["cache"] * d["kv"] * d["d"] * d["elem"]
    read = kv + d["heads"] * d["d"] * d["elem"]
    if d["heads"] % d["kv"]:
        check(s["decode-out"] == "—", "decode error shown: %s" % d)
        return
    secs = (read + d["heads"] * d["d"] * d["elem"]) / (d["bw"] * d["derate"])
    want = "Each new token reads %s per layer (K and V: %.1f MB), %s at " % (mb(read), kv / 1e6, seconds(secs))
    check(s["decode-out"].startswith(want), "decode %r vs %r" % (s["decode-out"], want))


def check_defaults(records):
    """The specification's figures at its defaults, as the page shows them."""
    s = next(r["shown"] for r in records if r["moved"] == "seq" and r["traffic"]["seq"] == 4096)
    got = (s["std-bytes"], s["std-time"], s["tiled-bytes"], s["tiled-time"], s["reduction"], s["nxn"])
    check(got == ("136.3 MB", "50.9 µs", "18.7 MB", "7.0 µs", "7.3×", "33.6 MB"), "defaults: %r" % (got,))


def chromium_args(chromium, profile):
    # --no-sandbox: Chromium's sandbox refuses to run as root, and in containers without user namespaces
    # fails for other users too; the browser only ever loads this page from a loopback server.
    return [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--user-data-dir=" + profile]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--attn", required=True)
    ap.add_argument("--dir", required=True)
    ap.add_argument("--screenshot", required=True)
    a = ap.parse_args()
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if not chromium:
        print("SKIPPED: no chromium (apt-get install chromium)")
        return SKIP
    if not os.path.exists(os.path.join(a.dir, "attn_explorer.wasm")):
        print("SKIPPED: no WebAssembly build in %s (Emscripten's em++ was not found)" % a.dir)
        return SKIP
    server = subprocess.Popen([a.attn, "explore", "--port", "0", "--dir", a.dir], stdout=subprocess.PIPE, text=True)
    try:
        url = None
        for _ in range(2):
            m = re.search(r"(http://\S+/)", server.stdout.readline())
            url = url or (m and m.group(1))
        if not url:
            print("FAILED: attn explore printed no URL")
            return 1
        with tempfile.TemporaryDirectory() as profile:
            dom = subprocess.run(chromium_args(chromium, profile) + ["--window-size=390,844", "--virtual-time-budget=60000",
                                 "--dump-dom", url + "index.html#drive"], capture_output=True, text=True, timeout=300).stdout
            m = re.search(r'<pre id="drive-log"[^>]*data-done="1"[^>]*>(.*?)</pre>', dom, re.S)
            if not m:
                print("FAILED: the page logged nothing (status: %r)" % re.findall(r'id="status"[^>]*>([^<]*)<', dom))
                return 1
            records = [json.loads(html.unescape(line)) for line in m.group(1).strip().split("\n")]
            subprocess.run(chromium_args(chromium, profile) + ["--window-size=1000,1700", "--virtual-time-budget=10000",
                           "--screenshot=" + os.path.abspath(a.screenshot), url], capture_output=True, timeout=300)
    finally:
        server.terminate()
        server.wait()
    cli = Cli(a.attn)
    for rec in records:
        if rec["moved"] == "focus":
            check(rec["unfocusable"] == [] and rec["controls"] >= 15, "keyboard: %s" % rec)
            continue
        if rec["moved"] == "count":
            c, text = cli.io(rec["traffic"], count=True), rec["shown"]["count-out"]
            for name, key in (("Algorithm 1", "tiled"), ("FA2 order", "fa2")):
                w = c[key]
                want = "%s: %s elements counted = %s closed form, SRAM peak %s, max |Δ| vs reference " % (
                    name, "{:,}".format(w["counted_elements"]), "{:,}".format(w["elements"]),
                    "{:,}".format(w["sram_peak_elements"]))
                check(want in text and c["counted_match"], "counted %s: page %r, CLI %s" % (key, text, w))
            continue
        check_traffic(cli, rec)
        check_tiled(cli, rec["shown"])
        check_splitk(cli, rec["shown"])
        check_decode(rec)
        lay = rec["shown"]["layout"]
        check(lay["scrollWidth"] <= lay["innerWidth"], "wider than a phone (390 px): %s" % lay)
    check_defaults(records)
    check(os.path.getsize(a.screenshot) > 10000 if os.path.exists(a.screenshot) else False, "no screenshot")
    moved = sorted({r["moved"] for r in records})
    print("%d page states (%s) compared with attn io / attn check; screenshot %s" % (len(records), ", ".join(moved), a.screenshot))
    print("tiled max |Δ|, page (EMU128) / CLI (native SIMD), by tile: " +
          ", ".join("%d: %s / %s" % (t, *tiled_pairs[t]) for t in sorted(tiled_pairs)))
    for f in failures[:40]:
        print("FAIL:", f)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
