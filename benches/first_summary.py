"""Summarize benches/daemon.sh's first-inference lines (JSON, one per consumer process).

Reads lines with lang (rust|py), warm (none|other|same), run, way (via|own), model and the
phase times; prints a Markdown table: per client, artifact profile and warm-up, the median
time to first inference through trtcache and on one's own, the ratio of the medians, the
median of the per-run ratios (own / via of the same run, warm-up and client) and in how many
runs that ratio was at least 3.
"""
import json
import statistics
import sys

rows = [json.loads(line) for line in sys.stdin if line.strip()]
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
