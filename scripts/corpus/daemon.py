#!/usr/bin/env python3
"""Serves a corpus (from `realworld.py` or `classes.py`) through the daemon with the
defaults, as a new user would: no sidecar, no golden file. `trtcache serve` on a folder of
NAME.onnx files, `trtcache warm`, then every model acquired with the Python client, run on its
feed and compared with ONNX Runtime's outputs (expected.pkl).

    scripts/corpus/daemon.py CORPUS [--trtcache target/release/trtcache] [--only REGEX]
                                     [--timeout 1800] [--json OUT.json]

A model that does not get served must fail with a precise reason (`warm`'s, printed); one
ORT itself cannot run is `ort-cannot`, and trtcache must refuse it with a reason (printed).
Exit 0 when every model ORT runs is served and matches and every other one is refused.
"""
import argparse
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "../../clients/python"))

import run as corpus_run  # noqa: E402
from trtcache_client import Client  # noqa: E402


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_run.serve_args(ap, HERE)
    a = ap.parse_args()
    only = re.compile(a.only) if a.only else None
    names = sorted(
        d for d in os.listdir(a.corpus)
        if os.path.isfile(os.path.join(a.corpus, d, "model.onnx")) and (not only or only.search(d))
    )
    tmp = tempfile.mkdtemp(prefix="trtcache-corpus-")
    models, cache = os.path.join(tmp, "models"), os.path.join(tmp, "cache")
    sock = os.path.join(tmp, "s.sock")
    os.makedirs(models)
    for n in names:
        corpus_run.copy_model(os.path.join(a.corpus, n), models, n)
    common = ["--models", models, "--cache-dir", cache, "--socket", sock]
    serve = corpus_run.start_serve(a.trtcache, common, sock, os.path.join(tmp, "serve.log"))
    results = []
    try:
        t0 = time.monotonic()
        w = subprocess.run([a.trtcache, "warm", *common, "--json", "--timeout", str(a.timeout)],
                           capture_output=True, text=True, env=corpus_run.ENV)
        warm_s = time.monotonic() - t0
        try:
            warm = json.loads(w.stdout)
        except ValueError:
            warm = None
        reasons = {}
        items = warm if isinstance(warm, list) else (warm or {}).get("models", []) if isinstance(warm, dict) else []
        for item in items:
            if isinstance(item, dict):
                nm = item.get("model") or item.get("name")
                if nm and item.get("state") not in (None, "ready"):
                    reasons[nm] = item.get("reason") or item.get("error") or item.get("message") or item.get("state")
        client = Client(sock)
        for n in names:
            d = os.path.join(a.corpus, n)
            feed = pickle.load(open(os.path.join(d, "feed.pkl"), "rb"))
            expected = pickle.load(open(os.path.join(d, "expected.pkl"), "rb"))
            r = {"test": n}
            try:
                ref = corpus_run.session(os.path.join(d, "model.onnx"))
                ref.run(None, corpus_run.feed_for(ref, feed))
            except Exception as e:
                # ORT itself cannot run it: trtcache must refuse it, with its own reason.
                r.update(cls="ort-cannot", why=corpus_run.first_line(str(e)), refused=reasons.get(n))
                results.append(r)
                continue
            try:
                art = client.acquire(n, timeout=60)
            except Exception as e:
                r.update(cls="not-served", why=str(reasons.get(n) or e)[:600])
                results.append(r)
                continue
            r["index"] = bool(getattr(art, "from_index", False))
            try:
                s = art.session(providers=["CPUExecutionProvider"])
                out = s.run(None, corpus_run.feed_for(s, feed))
                names_out = [o.name for o in s.get_outputs()]
                ref_names = [o.name for o in ref.get_outputs()]
                out = [out[names_out.index(x)] if x in names_out else None for x in ref_names]
                why = corpus_run.compare_all(out, expected, a.atol, a.rtol)
                exact = why and corpus_run.stft_exact(
                    os.path.join(d, "model.onnx"), art.dir_graph_path(), feed, ref_names, out,
                    expected, a.atol, a.rtol)
                if exact:
                    r.update(cls="pass", exact=f"{exact} (against ORT: {why})")
                else:
                    r.update(cls="mismatch" if why else "pass", why=why)
            except Exception as e:
                r.update(cls="artifact-error", why=corpus_run.first_line(str(e)))
            finally:
                art.close()
            results.append(r)
    finally:
        corpus_run.stop_serve(serve)
    for r in results:
        if r["cls"] != "pass":
            print(f"{r['test']}: {r['cls']}: {r.get('why')}")
            if r["cls"] == "ort-cannot":
                print(f"  trtcache: {r.get('refused') or 'NOT REFUSED (served, or no reason given)'}")
        elif r.get("exact"):
            print(f"{r['test']}: {r['exact']}")
    ran = [r for r in results if r["cls"] != "ort-cannot"]
    ok = [r for r in ran if r["cls"] == "pass"]
    cannot = [r for r in results if r["cls"] == "ort-cannot"]
    refused = [r for r in cannot if r.get("refused")]
    print(f"\nwarm: exit {w.returncode} in {warm_s:.1f}s")
    print(f"served through the daemon with the defaults and matching ONNX Runtime (a rewritten STFT: the float64 STFT): {len(ok)}/{len(ran)}"
          f" ({100 * len(ok) / max(1, len(ran)):.1f}%); ort-cannot: {len(cannot)} (refused with a reason: {len(refused)}); "
          f"acquired from the ready index: {sum(bool(r.get('index')) for r in results)}")
    exact = sum(1 for r in results if r.get("exact"))
    if exact:
        print(f"  of which {exact} match the float64 STFT their build's rewrite computes, not ONNX "
              f"Runtime's float32 one (docs/cache.md \"Graph rewrites\")")
    if a.json:
        json.dump(results, open(a.json, "w"), indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(0 if len(ok) == len(ran) and len(refused) == len(cannot) else 1)


if __name__ == "__main__":
    main()
