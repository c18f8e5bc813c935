#!/usr/bin/env python3
"""Hostile files at scale: damaged copies of a corpus's real models served by one daemon.

    scripts/corpus/mutate.py CORPUS [--trtcache target/release/trtcache] [--per-model 5]
        [--seed 0] [--only REGEX] [--timeout 1800] [--json OUT.json]

For every CORPUS/<name>/model.onnx (from `realworld.py`), PER_MODEL damaged copies, each one
of: `trunc` (cut at 5-95% of its length), `flip` (16 random bytes XORed), `zero` (a random
256-byte window zeroed), `splice` (a random chunk copied in elsewhere, so protobuf lengths
lie), `head` (8 bytes flipped in the first 512, where the model's header and the graph's
first fields are). The copies and the undamaged originals go in one folder, served by one
`trtcache serve` with the defaults (no sidecar; `build_timeout_secs = 120`), then `warm`.

What must hold, else exit 1:
  * the daemon is the same process after `warm` and still answers (`list`);
  * every original is served and matches ONNX Runtime's outputs (expected.pkl);
  * a damaged copy is either refused with a reason (one line, naming no temp copy under the
    cache), or served; a served copy's artifact, run on the corpus feed, matches what ONNX
    Runtime computes from that damaged file itself (optimizations off). trtcache validated
    it against that file, so a mismatch, or an artifact of another content, is a defect;
    a served copy whose file the reference cannot run on the corpus feed (trtcache found other
    inputs) is counted, not compared.
Prints the counts per mutation and outcome, and the distinct refusal reasons.
"""
import argparse
import collections
import json
import os
import pickle
import random
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

KINDS = ("trunc", "flip", "zero", "splice", "head")


def mutate(data, kind, r):
    b = bytearray(data)
    n = len(b)
    if kind == "trunc":
        return bytes(b[: max(1, int(n * r.uniform(0.05, 0.95)))])
    if kind == "flip":
        for _ in range(16):
            b[r.randrange(n)] ^= r.randrange(1, 256)
        return bytes(b)
    if kind == "zero":
        at = r.randrange(max(1, n - 256))
        b[at : at + 256] = bytes(len(b[at : at + 256]))
        return bytes(b)
    if kind == "splice":
        a = r.randrange(n)
        chunk = b[a : a + r.randrange(1, 4096)]
        at = r.randrange(n)
        return bytes(b[:at] + chunk + b[at:])
    if kind == "head":
        for _ in range(8):
            b[r.randrange(min(n, 512))] ^= r.randrange(1, 256)
        return bytes(b)
    raise ValueError(kind)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    corpus_run.serve_args(ap, HERE)
    ap.add_argument("--per-model", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    only = re.compile(a.only) if a.only else None
    names = sorted(
        d for d in os.listdir(a.corpus)
        if os.path.isfile(os.path.join(a.corpus, d, "model.onnx"))
        and not corpus_run.external_files(os.path.join(a.corpus, d))  # one-file models
        # ONNX Runtime runs it (expected.pkl not empty): an original ORT cannot run is refused,
        # as daemon.py checks, and its damaged copies would say nothing more.
        and pickle.load(open(os.path.join(a.corpus, d, "expected.pkl"), "rb"))
        and (not only or only.search(d))
    )
    r = random.Random(a.seed)
    tmp = tempfile.mkdtemp(prefix="trtcache-mutate-")
    models, cache = os.path.join(tmp, "models"), os.path.join(tmp, "cache")
    sock = os.path.join(tmp, "s.sock")
    os.makedirs(models)
    mutants = {}  # served name -> (original, kind)
    for n in names:
        src = os.path.join(a.corpus, n, "model.onnx")
        shutil.copy(src, os.path.join(models, n + ".onnx"))
        data = open(src, "rb").read()
        for k in range(a.per_model):
            kind = KINDS[(k + r.randrange(len(KINDS))) % len(KINDS)]
            m = f"{n}__{kind}{k}"
            with open(os.path.join(models, m + ".onnx"), "wb") as f:
                f.write(mutate(data, kind, r))
            mutants[m] = (n, kind)
    config = os.path.join(tmp, "config.toml")
    with open(config, "w") as f:
        f.write(f"models = {json.dumps(models)}\ncache_dir = {json.dumps(cache)}\nsocket = {json.dumps(sock)}\n"
                "[limits]\nbuild_timeout_secs = 120\n")
    log = os.path.join(tmp, "serve.log")
    serve = corpus_run.start_serve(a.trtcache, ["--config", config], sock, log)
    results, problems = [], []
    try:
        t0 = time.monotonic()
        w = subprocess.run([a.trtcache, "warm", "--config", config, "--json", "--timeout", str(a.timeout)],
                           capture_output=True, text=True, env=corpus_run.ENV)
        warm_s = time.monotonic() - t0
        if serve.poll() is not None:
            problems.append(f"the daemon exited during warm (rc {serve.returncode}); see {log}")
            raise SystemExit
        client = Client(sock)
        listed = {m["name"]: m for m in client.list()}
        for n in names:
            d = os.path.join(a.corpus, n)
            feed = pickle.load(open(os.path.join(d, "feed.pkl"), "rb"))
            expected = pickle.load(open(os.path.join(d, "expected.pkl"), "rb"))
            for m in [n] + [x for x, (o, _) in mutants.items() if o == n]:
                kind = mutants.get(m, (n, "original"))[1]
                res = {"model": m, "kind": kind}
                results.append(res)
                try:
                    art = client.acquire(m, timeout=a.timeout)
                except Exception as e:
                    why = str(e)
                    res.update(outcome="refused", why=why)
                    if kind == "original":
                        problems.append(f"{m}: the original is not served: {why}")
                    elif "\n" in why or "/tmp/build-" in why or not why.strip():
                        problems.append(f"{m}: refusal reason is not one clear line: {why!r}")
                    continue
                try:
                    s = art.session(providers=["CPUExecutionProvider"])
                    got = s.run(None, corpus_run.feed_for(s, feed))
                    out_names = [o.name for o in s.get_outputs()]
                    if kind == "original":
                        want = expected
                        ref_names = out_names
                    else:
                        try:
                            ref = corpus_run.session(os.path.join(models, m + ".onnx"))
                            want = ref.run(None, corpus_run.feed_for(ref, feed))
                            ref_names = [o.name for o in ref.get_outputs()]
                        except Exception as e:
                            res.update(outcome="served, feed not accepted by the reference",
                                       why=corpus_run.first_line(str(e)))
                            continue
                    got = [got[out_names.index(x)] if x in out_names else None for x in ref_names]
                    why = corpus_run.compare_all(got, want, a.atol, a.rtol)
                    exact = why and corpus_run.stft_exact(
                        os.path.join(models, m + ".onnx"), art.dir_graph_path(), feed, ref_names,
                        got, want, a.atol, a.rtol)
                    if exact:
                        why = None
                        res["exact"] = exact
                    res.update(outcome="served, mismatch" if why else "served, matches", why=why)
                    if why:
                        problems.append(f"{m}: served artifact differs from its file under ONNX Runtime: {why}")
                except Exception as e:
                    why = corpus_run.first_line(str(e))
                    try:  # the damaged file itself, under the reference, on the same feed
                        ref = corpus_run.session(os.path.join(models, m + ".onnx"))
                        ref.run(None, corpus_run.feed_for(ref, feed))
                    except Exception as e2:
                        res.update(outcome="served, feed not accepted by the reference",
                                   why=corpus_run.first_line(str(e2)))
                        continue
                    res.update(outcome="served, artifact fails", why=why)
                    problems.append(f"{m}: served artifact does not run where its file does: {why}")
                finally:
                    art.close()
        missing = [m for m in list(mutants) + names if m not in listed]
        if missing:
            problems.append(f"{len(missing)} models not listed by the daemon: {missing[:5]}")
        if serve.poll() is not None:
            problems.append(f"the daemon exited (rc {serve.returncode})")
    except SystemExit:
        pass
    finally:
        if serve.poll() is None:
            rc = corpus_run.stop_serve(serve)
            if rc != 0:
                problems.append(f"SIGTERM: the daemon exited {rc}")
    by = collections.Counter((x["kind"], x["outcome"]) for x in results)
    for kind in ("original",) + KINDS:
        row = {o: c for (k, o), c in by.items() if k == kind}
        if row:
            print(f"{kind:9} " + ", ".join(f"{o}: {c}" for o, c in sorted(row.items())))
    def reason(why):  # without the model's name and path, numbers as N
        why = re.sub(r"`[^`]*`", "`M`", why)
        why = re.sub(re.escape(models) + r"/\S*", "PATH", why)
        return re.sub(r"\d+", "N", why)[:150]

    reasons = collections.Counter(reason(x["why"]) for x in results if x["outcome"] == "refused")
    print(f"\n{len(reasons)} distinct refusal reasons (numbers as N); the most common:")
    for why, c in reasons.most_common(12):
        print(f"  {c:4}  {why}")
    print(f"\n{len(names)} originals, {len(mutants)} damaged copies; warm exit {w.returncode} in {warm_s:.1f}s; "
          f"daemon up throughout: {not any('exited' in p for p in problems)}")
    exact = [x["model"] for x in results if x.get("exact")]
    if exact:
        print(f"matching the float64 STFT their build's rewrite computes, not ONNX Runtime's float32 one "
              f"(docs/cache.md \"Graph rewrites\"): {len(exact)} ({', '.join(exact)})")
    for p in problems:
        print("PROBLEM:", p)
    if a.json:
        json.dump({"results": results, "problems": problems}, open(a.json, "w"), indent=1)
    shutil.rmtree(tmp, ignore_errors=True)
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
