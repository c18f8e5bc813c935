"""Summarize benches/daemon.sh's first-inference lines (JSON, one per consumer process).

Reads lines with lang (rust|py), warm (none|other|same), run, way (via|own), model and the
phase times; prints a Markdown table: per client, artifact profile and warm-up, the median
time to first inference through trtcache and on one's own, the ratio of the medians, the
median of the per-run ratios (own / via of the same run, warm-up and client) and in how many
runs that ratio was at least 3. With --probe: benches/first_probe.py's lines instead.
"""
import json
import statistics
import sys

rows = [json.loads(line) for line in sys.stdin if line.strip()]


def spread(xs):
    return "%.1f (%.1f–%.1f)" % (statistics.median(xs), min(xs), max(xs))


def probe():
    session = [r for r in rows if r["case"] == "session"]
    print("| artifact session, options | pinned to | session ms | first run ms | later runs ms |")
    print("|---|---|---|---|---|")
    for core in (0, 1):
        pick = [r for r in session if r.get("pinned") == core]
        if pick:
            print("| base | core %d | %s | %s | %s |" % (
                core, spread([r["session_ms"] for r in pick]),
                spread([r["first_run_ms"] for r in pick]),
                spread([r["steady_run_ms"] for r in pick])))
    for opt in dict.fromkeys(r["arg"] for r in session):
        pick = [r for r in session if r["arg"] == opt and "pinned" not in r]
        if pick:
            print("| %s | — | %s | %s | %s |" % (
                opt, spread([r["session_ms"] for r in pick]),
                spread([r["first_run_ms"] for r in pick]),
                spread([r["steady_run_ms"] for r in pick])))
    print()
    print("| control (pure Python) | loop of 10⁷ ms | 200 MB copy ms |")
    print("|---|---|---|")
    for core in (0, 1):
        pick = [r for r in rows if r["case"] == "compute" and r["cpu"] == core]
        if pick:
            print("| core %d | %s | %s |" % (core, spread([r["loop_ms"] for r in pick]),
                                            spread([r["copy_200mb_ms"] for r in pick])))
    print()
    print("| sessions one after another in one process | 1st ms | 2nd ms | 3rd ms | 4th ms |")
    print("|---|---|---|---|---|")
    for label, pick in (
        ("artifact (each kept open)", [r for r in rows if r["case"] == "sessions_in_a_process"]),
        ("raw model", [r for r in rows if r["case"] == "raw_sessions_in_a_process"
                       and not r.get("malloc_mmap_threshold")]),
        ("raw model, MALLOC_MMAP_THRESHOLD_=131072",
         [r for r in rows if r["case"] == "raw_sessions_in_a_process"
          and r.get("malloc_mmap_threshold")]),
    ):
        if pick:
            n = len(pick[0]["sessions_ms"])
            cells = [spread([r["sessions_ms"][i] for r in pick]) for i in range(n)]
            print("| %s | %s |" % (label, " | ".join(cells + ["—"] * (4 - n))))


if "--probe" in sys.argv:
    probe()
    sys.exit(0)
WARM = {
    "none": "none (first session)",
    "other": "unrelated model",
    "same": "the raw model itself",
}
LANG = {"rust": "Rust", "py": "Python"}
PROFILE = {"bert": "dynamic", "bert_fixed": "fixed [1, 16]"}


def med(xs):
    return statistics.median(xs) if xs else float("nan")


print("| client | artifact profile | warm-up before | via trtcache ms (session) | own ms (session) "
      "| ratio of medians | median per-run ratio | runs ≥ 3× |")
print("|---|---|---|---|---|---|---|---|")
for lang in ("rust", "py"):
    for model in ("bert", "bert_fixed"):
        for warm in ("none", "other", "same"):
            pick = [r for r in rows if r["lang"] == lang and r["warm"] == warm]
            via = {r["run"]: r for r in pick if r["way"] == "via" and r["model"] == model}
            own = {r["run"]: r for r in pick if r["way"] == "own"}
            if not via or not own:
                continue
            v = med([r["total_ms"] for r in via.values()])
            o = med([r["total_ms"] for r in own.values()])
            ratios = [own[k]["total_ms"] / via[k]["total_ms"] for k in via if k in own]
            print("| %s | %s | %s | %.1f (%.1f) | %.1f (%.1f) | %.2f× | %.2f× | %d of %d |" % (
                LANG[lang], PROFILE[model], WARM[warm],
                v, med([r["session_ms"] for r in via.values()]),
                o, med([r["session_ms"] for r in own.values()]),
                o / v, med(ratios), sum(x >= 3 for x in ratios), len(ratios)))
