#!/usr/bin/env python3
"""The exporters corpus (issue 41, section 4): tiny random-init models through the exporters
users serve that the other corpora lack, in the layout `run.py` reads, and a check of
trtcache's defaults on them with a second, larger input shape.

    # 1. the models (each step in a Python that has its exporter; see VERSIONS)
    /work/corpus-venv/bin/python scripts/corpus/exporters.py make DEST [--only REGEX] [--steps a,b]
    /work/corpus-venv-genai/bin/python scripts/corpus/exporters.py make DEST --steps genai
    # 2. trtcache's defaults on each (ONNX Runtime of the checkout's .venv, the one trtcache loads)
    eval "$(scripts/ort-env.sh)"
    .venv/bin/python scripts/corpus/exporters.py check DEST --trtcache BIN [--json OUT] [--md OUT]
    # the big (> 2 GiB) model is made and checked last, then deleted (disk is limited):
    .venv/bin/python scripts/corpus/exporters.py big DEST --trtcache BIN [--json OUT]
    # one summary (JSON) and markdown table from both
    .venv/bin/python scripts/corpus/exporters.py report CHECK.json BIG.json --json ALL.json --md ALL.md

Steps of `make` (each model is DEST/<name>/ with model.onnx and its external data, feed.pkl
(a realistic feed), expected.pkl (ONNX Runtime, optimizations off), golden.npz and
meta.json: exporter, package versions, the sizes and value rules of its inputs):
  optimum   optimum-onnx `main_export` from local random-init transformers models: a Llama
            decoder with past (text-generation-with-past), a T5 encoder-decoder
            (text2text-generation-with-past: encoder, decoder, decoder with past, the merged
            decoder), a Whisper encoder-decoder with past (automatic-speech-recognition-with-past),
            a ViT image classifier, BERT feature extraction;
  genai     onnxruntime-genai's model builder on the local Llama: int4/int8/fp16/fp32, CPU
            and CUDA targets (GroupQueryAttention, MatMulNBits, SimplifiedLayerNormalization);
  diffusers a tiny UNet2DConditionModel and AutoencoderKL decoder through torch.onnx.export,
            TorchScript (dynamo=False) and dynamo=True exporters;
  fp16      float16 conversions of the BERT, the UNet, the ViT and the Whisper encoder: onnxconverter-common and
            onnxruntime.transformers' float16, keep_io_types True and False;
  hummingbird  scikit-learn trees through hummingbird-ml (gemm, tree_trav, perf_tree_trav).
`big` writes a model with a 2.29 GB initializer in external data (a Gather table).

`check` runs `trtcache build MODEL --json --no-sidecar` with the defaults into a temporary
cache, then for every served artifact runs it and the original (ONNX Runtime CPU,
optimizations off) on the same random inputs (1) at the shapes validation used (the
record's `validation.shapes`) and (2) at a second, larger shape (the model's realistic
sizes from meta.json, each free dimension at least twice validation's), comparing with
trtcache's rule (src/spec.rs `Tolerance::half_bound`, src/build/validate.rs `compare_as`):
|a - r| <= atol + rtol |r| (1e-4, 1e-3), and for float16/bfloat16 outputs (or float32 ones
a Cast makes from them, src/onnx/resolution.rs `half_outputs`) also within 8 steps of the
type at max(|r|, rms(r)).

VERSIONS (pip, as used for the numbers in the report):
  /work/corpus-venv (python 3.11.7): torch 2.9.1, transformers 4.57.6, optimum-onnx 0.1.0,
    optimum 2.1.0, onnx 1.23.2, onnxruntime 1.32.0, onnxscript 0.7.2, onnx-ir 1.1.0,
    diffusers 0.36.0, onnxconverter-common 1.16.0, hummingbird-ml 0.4.11,
    scikit-learn 1.9.1, numpy 2.4.6
    (uv pip install "torch==2.9.1" "transformers>=4.55,<4.58" "optimum-onnx==0.1.0" onnx
     onnxruntime onnxscript "diffusers<0.37" onnxconverter-common hummingbird-ml scikit-learn)
  /work/corpus-venv-genai: onnxruntime-genai 0.18.0 (its builder imports transformers 5
    classes, so it cannot share optimum-onnx's venv), transformers 5.25.0, torch 2.9.1,
    onnx 1.23.2, onnxruntime 1.32.0
  check: the checkout's .venv (onnxruntime 1.31.1, the library trtcache loads)
"""
import argparse
import importlib.metadata as md
import json
import os
import pickle
import re
import shutil
import subprocess
import sys
import tempfile
import time
import traceback

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SRC = "src"  # DEST/src: the local random-init source models (configs + safetensors)


def versions(*pkgs):
    out = {}
    for p in pkgs:
        try:
            out[p] = md.version(p)
        except md.PackageNotFoundError:
            pass
    return out


# ---------------------------------------------------------------- feeds


def dims_of(vi, sizes):
    """The input's shape: fixed dims as declared, named ones from `sizes` (a dim_param such
    as `past_sequence_length + sequence_length` is evaluated over `sizes`), unnamed ones from
    sizes[(input, axis)], else 1."""
    shape = []
    for k, d in enumerate(vi.type.tensor_type.shape.dim):
        if d.HasField("dim_value") and d.dim_value > 0:
            shape.append(d.dim_value)
            continue
        p = d.dim_param
        if (vi.name, k) in sizes:
            shape.append(sizes[(vi.name, k)])
        elif p in sizes:
            shape.append(sizes[p])
        elif p and re.fullmatch(r"[\w\s+\-*/]+", p):
            try:
                shape.append(int(eval(p, {}, {k2: v for k2, v in sizes.items() if isinstance(k2, str)})))
            except Exception:
                shape.append(1)
        else:
            shape.append(1)
    return shape


def value(name, shape, dt, rules, g):
    """An input's values by its rule (meta `values`): int:LO:HI, ones, arange, uniform:LO:HI,
    normal; else by name (…ids → int 0..vocab, …mask → ones), floats standard normal."""
    rule = rules.get(name)
    if rule is None:
        if "mask" in name:
            rule = "ones"
        elif "token_type" in name:
            rule = "int:0:2"
        elif name.endswith("position_ids"):
            rule = "arange"
        elif dt.kind in "iu":
            rule = f"int:0:{rules.get('__vocab__', 2)}"
        elif dt.kind == "b":
            rule = "int:0:2"
        else:
            rule = "normal"
    if rule == "ones":
        return np.ones(shape, dt)
    if rule == "arange":
        n = shape[-1] if shape else 1
        return np.broadcast_to(np.arange(n), shape).astype(dt).copy()
    kind, *a = rule.split(":")
    if kind == "int":
        return g.integers(int(a[0]), int(a[1]), shape).astype(dt)
    if kind == "uniform":
        return g.uniform(float(a[0]), float(a[1]), shape).astype(dt)
    if kind == "const":
        return np.full(shape, float(a[0])).astype(dt)
    return g.standard_normal(shape).astype(dt)


def make_feed(path, sizes, rules, seed=0, shapes=None):
    """A feed for the model's graph inputs (not initializers): `shapes` (input -> dims, e.g.
    the record's validation shapes) where given, else from `sizes`."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    g = np.random.default_rng(seed)
    feed = {}
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        dt = onnx.helper.tensor_dtype_to_np_dtype(vi.type.tensor_type.elem_type)
        shape = list(shapes[vi.name]) if shapes and vi.name in shapes else dims_of(vi, sizes)
        feed[vi.name] = value(vi.name, shape, dt, rules, g)
    return feed


def ort_session(path, opt=None):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = opt if opt is not None else ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def save(dest, name, model_path, exporter, sizes, rules=None, pkgs=(), fixed=()):
    """DEST/name: the model (external data beside it), the feed, ORT's outputs, meta.json."""
    import onnx

    rules = rules or {}
    d = os.path.join(dest, name)
    if os.path.exists(d):
        shutil.rmtree(d)
    os.makedirs(d)
    m = onnx.load(model_path, load_external_data=False)
    locs = sorted({e.value for t in m.graph.initializer if t.data_location == onnx.TensorProto.EXTERNAL
                   for e in t.external_data if e.key == "location"})
    shutil.copy(model_path, os.path.join(d, "model.onnx"))
    for loc in locs:
        shutil.copy(os.path.join(os.path.dirname(model_path), loc), os.path.join(d, loc))
    feed = make_feed(os.path.join(d, "model.onnx"), sizes, rules)
    try:
        s = ort_session(os.path.join(d, "model.onnx"))
        expected = s.run(None, feed)
        err = None
    except Exception as e:  # ONNX Runtime's own refusal: kept, the check says so
        expected, err = [], str(e).splitlines()[0][:300]
        print(f"{name}: ONNX Runtime cannot run it: {err}", flush=True)
    with open(os.path.join(d, "feed.pkl"), "wb") as f:
        pickle.dump(feed, f)
    with open(os.path.join(d, "expected.pkl"), "wb") as f:
        pickle.dump(expected, f)
    np.savez(os.path.join(d, "golden.npz"), **feed)
    meta = {
        "exporter": exporter,
        "versions": versions("onnx", "onnxruntime", "torch", *pkgs),
        "sizes": {k if isinstance(k, str) else f"{k[0]}#{k[1]}": v for k, v in sizes.items()},
        "values": rules,
        "fixed": [k if isinstance(k, str) else f"{k[0]}#{k[1]}" for k in fixed],
        "ir_version": m.ir_version,
        "opsets": {o.domain: o.version for o in m.opset_import},
        "ort_error": err,
    }
    with open(os.path.join(d, "meta.json"), "w") as f:
        json.dump(meta, f, indent=1)
    print(f"wrote {name} ({exporter})", flush=True)


def sizes_from_meta(meta):
    out = {}
    for k, v in meta.get("sizes", {}).items():
        if "#" in k:
            a, b = k.rsplit("#", 1)
            out[(a, int(b))] = v
        else:
            out[k] = v
    return out


# ---------------------------------------------------------------- sources


def llama_source(dest):
    """A tiny random-init Llama with a local WordLevel tokenizer (no hub)."""
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    d = os.path.join(dest, SRC, "llama")
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        return d
    torch.manual_seed(0)
    c = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                    num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
                    bos_token_id=1, eos_token_id=2, pad_token_id=0)
    LlamaForCausalLM(c).save_pretrained(d)
    tokenizer_to(d, 256)
    return d


def tokenizer_to(d, vocab):
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    words = {"<pad>": 0, "<s>": 1, "</s>": 2, "<unk>": 3}
    words.update({f"w{i}": i for i in range(4, vocab)})
    tok = Tokenizer(models.WordLevel(words, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", unk_token="<unk>",
                            pad_token="<pad>").save_pretrained(d)


def t5_source(dest):
    import torch
    from transformers import T5Config, T5ForConditionalGeneration

    d = os.path.join(dest, SRC, "t5")
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        return d
    torch.manual_seed(0)
    c = T5Config(vocab_size=256, d_model=64, d_kv=16, d_ff=128, num_layers=2, num_decoder_layers=2, num_heads=4,
                 decoder_start_token_id=0, pad_token_id=0, eos_token_id=2)
    T5ForConditionalGeneration(c).save_pretrained(d)
    tokenizer_to(d, 256)
    return d


def bert_source(dest):
    import torch
    from transformers import BertConfig, BertModel

    d = os.path.join(dest, SRC, "bert")
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        return d
    torch.manual_seed(0)
    c = BertConfig(vocab_size=256, hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                   max_position_embeddings=128)
    BertModel(c).save_pretrained(d)
    tokenizer_to(d, 256)
    return d


def whisper_source(dest):
    import torch
    from transformers import WhisperConfig, WhisperForConditionalGeneration

    d = os.path.join(dest, SRC, "whisper")
    if os.path.exists(os.path.join(d, "tokenizer.json")):
        return d
    torch.manual_seed(0)
    c = WhisperConfig(vocab_size=256, num_mel_bins=16, d_model=64, encoder_layers=2, decoder_layers=2,
                      encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                      max_source_positions=32, max_target_positions=64, decoder_start_token_id=1, pad_token_id=0,
                      bos_token_id=1, eos_token_id=2, begin_suppress_tokens=None, suppress_tokens=None)
    WhisperForConditionalGeneration(c).save_pretrained(d)
    tokenizer_to(d, 256)
    from transformers import WhisperFeatureExtractor

    WhisperFeatureExtractor(feature_size=16).save_pretrained(d)
    return d


def vit_source(dest):
    import torch
    from transformers import ViTConfig, ViTForImageClassification, ViTImageProcessor

    d = os.path.join(dest, SRC, "vit")
    if os.path.exists(os.path.join(d, "preprocessor_config.json")):
        return d
    torch.manual_seed(0)
    c = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  intermediate_size=128, num_labels=10)
    ViTForImageClassification(c).save_pretrained(d)
    ViTImageProcessor(size={"height": 32, "width": 32}).save_pretrained(d)
    return d


# ---------------------------------------------------------------- steps

OPT_PKGS = ("optimum-onnx", "optimum", "transformers")
LM = {"batch_size": 2, "sequence_length": 12, "past_sequence_length": 20, "total_sequence_length": 32,
      "encoder_sequence_length": 16, "decoder_sequence_length": 6, "past_decoder_sequence_length": 20,
      "encoder_sequence_length_out": 16, "kv_cache_dim": 16}
# Sizes the weights fix (never scaled) and sizes other sizes make (recomputed after scaling).
FIXED = ["kv_cache_dim"]
DERIVED = {"total_sequence_length": "past_sequence_length + sequence_length"}


def optimum_models(dest, only):
    from optimum.exporters.onnx import main_export

    jobs = [
        ("opt_llama_past", llama_source, "text-generation-with-past", {}),
        ("opt_t5", t5_source, "text2text-generation-with-past", {}),
        ("opt_bert", bert_source, "feature-extraction", {}),
        ("opt_whisper", whisper_source, "automatic-speech-recognition-with-past", {"nb_max_frames": 64}),
        ("opt_vit", vit_source, "image-classification", {}),
    ]
    # Sizes the weights fix: Whisper's encoder takes exactly 2 x max_source_positions frames
    # of num_mel_bins features; the ViT's patch Conv fixes its channels (3), its position
    # embeddings its image side (optimum declares all three free).
    fixed = {"opt_whisper": ["encoder_sequence_length", "feature_size", "input_features#1", "input_features#2"],
             "opt_vit": ["pixel_values#1", "pixel_values#2", "pixel_values#3"]}
    sizes = {"opt_whisper": dict(LM, encoder_sequence_length=64, feature_size=16,
                                 **{"encoder_sequence_length / 2": 32}),
             "opt_vit": {**LM, ("pixel_values", 1): 3, ("pixel_values", 2): 32, ("pixel_values", 3): 32}}
    for name, src, task, kw in jobs:
        if only and not any(only.search(n) for n in (name, name + "_x")):
            continue
        s = src(dest)
        out = os.path.join(dest, SRC, "export_" + name)
        shutil.rmtree(out, ignore_errors=True)
        main_export(s, out, task=task, do_validation=False, **kw)
        files = sorted(f for f in os.listdir(out) if f.endswith(".onnx"))
        for f in files:
            n = name if len(files) == 1 else f"{name}_{f[:-5]}"
            if only and not only.search(n):
                continue
            save(dest, n, os.path.join(out, f), f"optimum-onnx main_export task={task} ({f})", sizes.get(name, LM),
                 {"__vocab__": 256}, OPT_PKGS, fixed=fixed.get(name, ()))


GENAI = [("int4", "cpu"), ("int8", "cpu"), ("fp32", "cpu"), ("int4", "cuda"), ("fp16", "cuda"), ("fp16", "cpu")]


def genai_models(dest, only):
    src = os.path.join(dest, SRC, "llama")
    if not os.path.exists(os.path.join(src, "tokenizer.json")):
        tokenizer_to(src, 256) if os.path.exists(src) else llama_source(dest)
    for prec, ep in GENAI:
        name = f"genai_llama_{prec}_{ep}"
        if only and not only.search(name):
            continue
        out = os.path.join(dest, SRC, name)
        shutil.rmtree(out, ignore_errors=True)
        cmd = [sys.executable, "-m", "onnxruntime_genai.models.builder", "-i", src, "-o", out, "-p", prec, "-e", ep,
               "-c", os.path.join(dest, SRC, "genai_cache")]
        p = subprocess.run(cmd, capture_output=True, text=True)
        if p.returncode != 0 or not os.path.exists(os.path.join(out, "model.onnx")):
            tail = (p.stderr or p.stdout).strip().splitlines()[-1:] or ["?"]
            print(f"{name}: the builder failed: {tail[0][:300]}", flush=True)
            with open(os.path.join(dest, "SKIPPED.txt"), "a") as f:
                f.write(f"{name}: builder failed: {tail[0][:300]}\n")
            continue
        # GroupQueryAttention: "batch_size must be 1 when sequence_length > 1 and past context
        # is given" (a prompt over a past is one sequence at a time): batch 1, never scaled.
        # fp16 on CPU (no GroupQueryAttention: MultiHeadAttention with a reformatted mask):
        # ONNX Runtime 1.31/1.32 runs it only without a past (with one: "invalid expand shape",
        # or "Shape mismatch attempting to re-use buffer" for one new token): a prompt.
        sizes, fixed = dict(LM, batch_size=1), ["batch_size"]
        if (prec, ep) == ("fp16", "cpu"):
            sizes.update(past_sequence_length=0, total_sequence_length=12)
            fixed.append("past_sequence_length")
        save(dest, name, os.path.join(out, "model.onnx"), f"onnxruntime-genai builder -p {prec} -e {ep}",
             sizes, {"__vocab__": 256}, ("onnxruntime-genai", "transformers"), fixed=fixed)


def tiny_unet():
    import torch
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, layers_per_block=1, block_out_channels=(32, 64),
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"), up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=16).eval()


def tiny_vae():
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(0)
    return AutoencoderKL(in_channels=3, out_channels=3, latent_channels=4, block_out_channels=(32, 64),
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         layers_per_block=1, norm_num_groups=16).eval()


class UNetWrap:
    pass


def diffusers_models(dest, only):
    import torch

    class U(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, sample, timestep, encoder_hidden_states):
            return self.m(sample, timestep, encoder_hidden_states, return_dict=False)[0]

    class D(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, latent_sample):
            return self.m.decode(latent_sample, return_dict=False)[0]

    class E(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, sample):
            return self.m.encode(sample, return_dict=False)[0].mean

    unet, vae = tiny_unet(), tiny_vae()
    jobs = [
        ("unet", U(unet), (torch.randn(1, 4, 16, 16), torch.tensor([10.0]), torch.randn(1, 8, 32)),
         ["sample", "timestep", "encoder_hidden_states"], ["out_sample"],
         {"sample": {0: "batch", 2: "height", 3: "width"}, "timestep": {0: "batch"},
          "encoder_hidden_states": {0: "batch", 1: "text_len"}},
         {"batch": 2, "height": 32, "width": 32, "text_len": 16}, {"timestep": "uniform:0:1000"}),
        ("vae_decoder", D(vae), (torch.randn(1, 4, 8, 8),), ["latent_sample"], ["sample"],
         {"latent_sample": {0: "batch", 2: "height", 3: "width"}}, {"batch": 1, "height": 32, "width": 32}, {}),
        ("vae_encoder", E(vae), (torch.randn(1, 3, 32, 32),), ["sample"], ["latent_mean"],
         {"sample": {0: "batch", 2: "height", 3: "width"}}, {"batch": 1, "height": 64, "width": 64}, {}),
    ]
    for base, mod, args, ins, outs, axes, named, rules in jobs:
        # per (input, axis): the dynamo exporter names dims s0, s1, ... of its own
        sizes = {(n, ax): named[d] for n, a in axes.items() for ax, d in a.items()}
        for dynamo in (False, True):
            name = f"diffusers_{base}_{'dynamo' if dynamo else 'ts'}"
            if only and not only.search(name):
                continue
            out = os.path.join(dest, SRC, name + ".onnx")
            try:
                with torch.no_grad():
                    if dynamo:
                        from torch.export import Dim

                        shapes = {n: {ax: Dim.AUTO for ax in axes.get(n, {})} for n in ins}
                        torch.onnx.export(mod, args, out, input_names=ins, output_names=outs, dynamo=True,
                                          dynamic_shapes=shapes, opset_version=18, external_data=False)
                    else:
                        torch.onnx.export(mod, args, out, input_names=ins, output_names=outs, dynamo=False,
                                          dynamic_axes=axes, opset_version=17)
            except Exception as e:
                msg = str(e).strip().splitlines()[0][:300]
                print(f"{name}: export failed: {msg}", flush=True)
                with open(os.path.join(dest, "SKIPPED.txt"), "a") as f:
                    f.write(f"{name}: export failed: {msg}\n")
                continue
            # dynamo=True traces the batch as 1 where the model broadcasts it (the UNet's output
            # is declared [1, 4, h, w]): batch 1 for those, never scaled.
            fixed = [(n, 0) for n in ins if 0 in axes.get(n, {})] if dynamo else []
            sz = dict(sizes)
            sz.update({k: 1 for k in fixed})
            save(dest, name, out, f"torch.onnx.export dynamo={dynamo} (diffusers {base})", sz, rules,
                 ("diffusers", "onnxscript", "onnx-ir"), fixed=fixed)


def fp16_models(dest, only):
    import onnx

    unet = {("sample", 0): 2, ("sample", 2): 32, ("sample", 3): 32, ("timestep", 0): 2,
            ("encoder_hidden_states", 0): 2, ("encoder_hidden_states", 1): 16}
    bases = [("opt_bert", LM, {"__vocab__": 256}, ()), ("diffusers_unet_ts", unet, {"timestep": "uniform:0:1000"}, ()),
             ("opt_vit", {("pixel_values", 0): 2, ("pixel_values", 1): 3, ("pixel_values", 2): 32,
                          ("pixel_values", 3): 32}, {}, ["pixel_values#1", "pixel_values#2", "pixel_values#3"]),
             ("opt_whisper_encoder_model", {"batch_size": 2, "feature_size": 16, "encoder_sequence_length": 64}, {},
              ["feature_size", "encoder_sequence_length", "input_features#1", "input_features#2"])]
    for base, sizes, rules, fixed in bases:
        p = os.path.join(dest, base, "model.onnx")
        if not os.path.exists(p):
            print(f"fp16: {base} missing, skipped", flush=True)
            continue
        for conv in ("occ", "ortx"):
            for keep in (True, False):
                name = f"fp16_{base}_{conv}_{'keepio' if keep else 'fp16io'}"
                if only and not only.search(name):
                    continue
                m = onnx.load(p)
                if conv == "occ":
                    from onnxconverter_common import float16

                    m16 = float16.convert_float_to_float16(m, keep_io_types=keep)
                    label = f"onnxconverter_common.float16.convert_float_to_float16(keep_io_types={keep})"
                else:
                    from onnxruntime.transformers import float16

                    m16 = float16.convert_float_to_float16(m, keep_io_types=keep)
                    label = f"onnxruntime.transformers.float16.convert_float_to_float16(keep_io_types={keep})"
                out = os.path.join(dest, SRC, name + ".onnx")
                onnx.save(m16, out)
                save(dest, name, out, f"{label} of {base}", sizes, rules, ("onnxconverter-common",), fixed=fixed)


def hummingbird_models(dest, only):
    import hummingbird.ml
    from sklearn.datasets import make_classification, make_regression
    from sklearn.ensemble import GradientBoostingRegressor, IsolationForest, RandomForestClassifier
    from sklearn.tree import DecisionTreeClassifier

    X, y = make_classification(n_samples=400, n_features=12, n_informative=6, n_classes=3, random_state=0)
    Xr, yr = make_regression(n_samples=400, n_features=12, random_state=0)
    X, Xr = X.astype(np.float32), Xr.astype(np.float32)
    jobs = [
        ("hb_rf_gemm", RandomForestClassifier(n_estimators=10, max_depth=5, random_state=0).fit(X, y), X, "gemm"),
        ("hb_gbr_tree_trav", GradientBoostingRegressor(n_estimators=20, max_depth=4, random_state=0).fit(Xr, yr), Xr,
         "tree_trav"),
        ("hb_dt_perf_tree_trav", DecisionTreeClassifier(max_depth=8, random_state=0).fit(X, y), X, "perf_tree_trav"),
        ("hb_iforest", IsolationForest(n_estimators=10, random_state=0).fit(X), X, None),
    ]
    import functools

    import torch

    # hummingbird 0.4.11 calls torch.onnx.export without `dynamo`, which torch >= 2.9 takes as
    # dynamo=True, where its graphs fail torch.export: its own (TorchScript) path, as released.
    plain = torch.onnx.export
    torch.onnx.export = functools.partial(plain, dynamo=False)
    for name, est, data, impl in jobs:
        if only and not only.search(name):
            continue
        extra = {"tree_implementation": impl} if impl else {}
        try:
            m = hummingbird.ml.convert(est, "onnx", data[:4], extra_config=extra)
        except Exception as e:
            msg = str(e).strip().splitlines()[0][:300]
            print(f"{name}: convert failed: {msg}", flush=True)
            continue
        out = os.path.join(dest, SRC, name)
        shutil.rmtree(out, ignore_errors=True)
        m.save(out)
        onnxf = [os.path.join(r, f) for r, _, fs in os.walk(out) for f in fs if f.endswith(".onnx")]
        if not onnxf and os.path.exists(out + ".zip"):
            import zipfile

            zipfile.ZipFile(out + ".zip").extractall(out)
            onnxf = [os.path.join(r, f) for r, _, fs in os.walk(out) for f in fs if f.endswith(".onnx")]
        save(dest, name, onnxf[0], f"hummingbird-ml convert(onnx, tree_implementation={impl})", {}, {},
             ("hummingbird-ml", "scikit-learn"))
        # a realistic batch: 64 rows
        meta_p = os.path.join(dest, name, "meta.json")
        meta = json.load(open(meta_p))
        import onnx

        g = onnx.load(os.path.join(dest, name, "model.onnx")).graph
        meta["sizes"] = {f"{g.input[0].name}#0": 64}
        json.dump(meta, open(meta_p, "w"), indent=1)


STEPS = {"optimum": optimum_models, "diffusers": diffusers_models, "fp16": fp16_models,
         "hummingbird": hummingbird_models, "genai": genai_models}


def make(a):
    only = re.compile(a.only) if a.only else None
    os.makedirs(os.path.join(a.dest, SRC), exist_ok=True)
    for s in a.steps.split(","):
        t = time.monotonic()
        try:
            STEPS[s](a.dest, only)
        except Exception as e:
            traceback.print_exc()
            with open(os.path.join(a.dest, "SKIPPED.txt"), "a") as f:
                f.write(f"step {s}: {str(e).splitlines()[0][:300]}\n")
        print(f"step {s}: {time.monotonic() - t:.0f}s", flush=True)


# ---------------------------------------------------------------- check

ENV = dict(os.environ, NO_COLOR="1", RUST_LOG="error")
ATOL, RTOL, ULPS = 1e-4, 1e-3, 8


def half_outputs(path):
    from run import half_outputs as h

    return h(path)


def float_step(elem, mag):
    from run import float_step as f

    return f(elem, mag)


def compare(ref, got, half):
    """None when `got` matches `ref` under trtcache's rule, else a short reason."""
    r = np.asarray(ref)
    a = np.asarray(got)
    if r.shape != a.shape:
        return f"shape {a.shape} != {r.shape}"
    if r.dtype.kind not in "fc":
        return None if np.array_equal(r, a) else f"{int((r != a).sum())} of {r.size} differ"
    rf, af = r.astype(np.float64), a.astype(np.float64)
    with np.errstate(all="ignore"):
        scale = float(np.sqrt(np.mean(rf[np.isfinite(rf)] ** 2))) if np.isfinite(rf).any() else 0.0
        d = np.abs(rf - af)
        bound = ATOL + RTOL * np.abs(rf)
        if half:
            step = np.vectorize(lambda x: float_step(half, max(abs(x), scale)))(rf) if rf.size < 2_000_000 else \
                float_step(half, max(float(np.nanmax(np.abs(rf))), scale))
            bound = np.maximum(bound, ULPS * step)
        ok = (np.isnan(rf) & np.isnan(af)) | (rf == af) | (d <= bound)
    bad = ~ok
    if bad.any():
        return f"{int(bad.sum())} of {r.size} elements over tolerance (max abs {float(np.nanmax(d[bad])):.3g})"
    return None


def run_both(model, artifact, feed):
    """(None, reason) when either run fails; else (mismatch-or-None, detail)."""
    half = half_outputs(model)
    ref = ort_session(model)
    names = [o.name for o in ref.get_outputs()]
    rv = ref.run(None, {i.name: feed[i.name] for i in ref.get_inputs()})
    s = ort_session(artifact)
    av = s.run(None, {i.name: feed[i.name] for i in s.get_inputs() if i.name in feed})
    an = [o.name for o in s.get_outputs()]
    for n, r in zip(names, rv):
        if n not in an:
            return f"artifact lacks output {n}", None
        why = compare(r, av[an.index(n)], half.get(n))
        if why:
            return f"`{n}`: {why}", None
    return None, None


def check_one(d, trtcache, cache, timeout, memory_limit=None):
    name = os.path.basename(d)
    model = os.path.join(d, "model.onnx")
    meta = json.load(open(os.path.join(d, "meta.json")))
    res = {"model": name, "exporter": meta["exporter"]}
    try:
        ort_session(model)
        res["ort_runs"] = True
    except Exception as e:
        res["ort_runs"] = False
        res["ort_error"] = str(e).splitlines()[0][:300]
    t0 = time.monotonic()
    cmd = [trtcache, "build", model, "--json", "--no-sidecar", "--cache-dir", cache]
    if memory_limit:
        # the build worker's bound (default: 3/4 of the machine), on a shared machine
        cmd += ["--memory-limit", memory_limit]
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=ENV)
    except subprocess.TimeoutExpired:
        res.update(served=False, reason=f"timeout after {timeout}s")
        return res
    res["build_s"] = round(time.monotonic() - t0, 1)
    try:
        j = json.loads(p.stdout)
    except ValueError:
        res.update(served=False, reason=(p.stderr.strip().splitlines() or ["?"])[-1][:600])
        return res
    if "error" in j:
        res.update(served=False, reason=j["error"].get("message", "")[:1200])
        return res
    v = (j.get("record") or {}).get("validation") or {}
    res["validation_shapes"] = v.get("shapes")
    # the level stored (absent in the record: the level asked for, `all`) and the artifacts
    # refused before it (rewrites, higher levels), each with its worst outputs
    res["opt_level"] = v.get("opt_level") or "all"
    if v.get("rejected"):
        res["rejected"] = v["rejected"]
    if not j.get("servable"):
        res.update(served=False, reason=str(j.get("unservable"))[:1200],
                   validation_outputs=[o for o in v.get("outputs", []) if not o.get("passed")][:3])
        return res
    res["served"] = True
    art = j["artifact"]["entry"]
    rules = dict(meta.get("values") or {})
    # (1) the artifact against ORT on the unoptimized model, at validation's shapes
    try:
        feed = make_feed(model, {}, rules, seed=1, shapes=v.get("shapes") or {})
        why, _ = run_both(model, art, feed)
        res["match_at_validation_shape"] = why is None
        if why:
            res["mismatch_at_validation_shape"] = why
    except Exception as e:
        res["match_at_validation_shape"] = None
        res["error_at_validation_shape"] = str(e).splitlines()[0][:400]
    # (2) a second, larger shape: the model's realistic sizes, each free dim >= 2x validation's
    try:
        sizes = sizes_from_meta(meta)
        import onnx

        g = onnx.load(model, load_external_data=False).graph
        vs = v.get("shapes") or {}
        fixed = set(meta.get("fixed") or [])
        for vi in g.input:
            for k, dd in enumerate(vi.type.tensor_type.shape.dim):
                if dd.HasField("dim_value") and dd.dim_value > 0 or vi.name not in vs:
                    continue
                key = (vi.name, k) if (vi.name, k) in sizes or dd.dim_param not in sizes else dd.dim_param
                if dd.dim_param and "+" in dd.dim_param or dd.dim_param in FIXED or dd.dim_param in DERIVED:
                    continue
                if dd.dim_param in fixed or f"{vi.name}#{k}" in fixed:
                    continue
                want = max(sizes.get(key, 1), 2 * vs[vi.name][k])
                sizes[key] = want
        for k, expr in DERIVED.items():
            if k in sizes:
                sizes[k] = int(eval(expr, {}, {n: x for n, x in sizes.items() if isinstance(n, str)}))
        feed = make_feed(model, sizes, rules, seed=2)
        res["larger_shapes"] = {k: list(x.shape) for k, x in feed.items()}
        # A one-element bool input (a merged decoder's use_cache_branch) is run both ways.
        flags = [k for k, x in feed.items() if x.dtype == np.bool_ and x.size == 1]
        why = None
        for flag in ([None] if not flags else [False, True]):
            if flag is not None:
                for k in flags:
                    feed[k] = np.full(feed[k].shape, flag)
            why, _ = run_both(model, art, feed)
            if why:
                why = f"{why} (with {flags[0]}={flag})" if flag is not None else why
                break
        res["match_at_larger_shape"] = why is None
        if why:
            res["mismatch_at_larger_shape"] = why
    except Exception as e:
        res["match_at_larger_shape"] = None
        res["error_at_larger_shape"] = str(e).splitlines()[0][:400]
    return res


def md_table(results):
    rows = ["| model | exporter | ORT runs | served | matches at validation shape | validation shapes | "
            "larger shape | matches at larger shape | reason / note |",
            "|---|---|---|---|---|---|---|---|---|"]
    for r in results:
        note = r.get("reason") or r.get("mismatch_at_larger_shape") or r.get("error_at_larger_shape") or \
            r.get("mismatch_at_validation_shape") or r.get("error_at_validation_shape") or ""
        note = note.replace("|", "\\|").replace("\n", " ")[:300]
        fmt = lambda s: "; ".join(f"{k} {'x'.join(map(str, x))}" for k, x in (s or {}).items())[:160]
        rows.append(f"| {r['model']} | {r['exporter']} | {'yes' if r.get('ort_runs') else 'no'} | "
                    f"{'yes' if r.get('served') else 'no'} | {yn(r.get('match_at_validation_shape'))} | "
                    f"{fmt(r.get('validation_shapes'))} | {fmt(r.get('larger_shapes'))} | "
                    f"{yn(r.get('match_at_larger_shape'))} | {note} |")
    return "\n".join(rows) + "\n"


def yn(x):
    return "-" if x is None else ("yes" if x else "**no**")


def summary(results):
    n = len(results)
    served = [r for r in results if r.get("served")]
    matched = [r for r in served if r.get("match_at_validation_shape")]
    caught = [r for r in served if r.get("match_at_larger_shape") is False]
    # issue 41's first number: served and matching, or refused only where ONNX Runtime
    # itself cannot run the model
    ok = len(matched) + sum(1 for r in results if not r.get("served") and r.get("ort_runs") is False)
    return {
        "models": n,
        "ok": ok,
        "ok_pct": round(100 * ok / n, 1) if n else 0,
        "served": len(served),
        "served_pct": round(100 * len(served) / n, 1) if n else 0,
        "matched_at_validation_shape": len(matched),
        "matched_pct": round(100 * len(matched) / n, 1) if n else 0,
        "refused": [{"model": r["model"], "reason": r.get("reason"), "ort_runs": r.get("ort_runs")}
                    for r in results if not r.get("served")],
        "caught_at_larger_shape": [{"model": r["model"], "why": r.get("mismatch_at_larger_shape")} for r in caught],
        "larger_shape_errors": [{"model": r["model"], "why": r.get("error_at_larger_shape")}
                                for r in served if r.get("match_at_larger_shape") is None],
    }


def check(a):
    only = re.compile(a.only) if a.only else None
    tests = sorted(d for d in os.listdir(a.dest) if os.path.isfile(os.path.join(a.dest, d, "meta.json"))
                   and (not only or only.search(d)))
    results = []
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        cache = os.path.join(tmp, "cache")
        for t in tests:
            r = check_one(os.path.join(a.dest, t), a.trtcache, cache, a.timeout, a.memory_limit)
            results.append(r)
            print(json.dumps(r), flush=True)
    out = {"summary": summary(results), "results": results}
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)
    if a.md:
        open(a.md, "w").write(md_table(results))
    print(json.dumps(out["summary"], indent=1))


# ---------------------------------------------------------------- big


def big(a):
    """A model above 2 GiB: a 560,000 x 1,024 float32 Gather table (2.29 GB) in external data,
    then a MatMul; checked like the others, then deleted."""
    import onnx
    from onnx import TensorProto as T, helper

    name = "big_external_2g"
    d = os.path.join(a.dest, name)
    shutil.rmtree(d, ignore_errors=True)
    os.makedirs(d)
    rows, dim = 560_000, 1024
    g = np.random.default_rng(0)
    with open(os.path.join(d, "table.bin"), "wb") as f:
        for i in range(0, rows, 40_000):
            f.write(g.standard_normal((40_000, dim), dtype=np.float32).tobytes())
    table = T()
    table.name, table.data_type = "table", T.FLOAT
    table.dims.extend([rows, dim])
    table.data_location = T.EXTERNAL
    for k, v in (("location", "table.bin"), ("offset", "0"), ("length", str(rows * dim * 4))):
        table.external_data.add(key=k, value=v)
    w = helper.make_tensor("w", T.FLOAT, [dim, 16], g.standard_normal((dim, 16)).astype(np.float32).ravel())
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["emb"]), helper.make_node("MatMul", ["emb", "w"], ["y"])],
        "big", [helper.make_tensor_value_info("ids", T.INT64, ["batch", "seq"])],
        [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", 16])], [table, w])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    m.ir_version = 9
    onnx.save(m, os.path.join(d, "model.onnx"))
    meta = {"exporter": "onnx.helper, 2.29 GB external initializer", "versions": versions("onnx", "numpy"),
            "sizes": {"batch": 4, "seq": 64}, "values": {"ids": f"int:0:{rows}"}}
    json.dump(meta, open(os.path.join(d, "meta.json"), "w"), indent=1)
    print(f"wrote {name}: {os.path.getsize(os.path.join(d, 'table.bin')) / 1e9:.2f} GB", flush=True)
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        r = check_one(d, a.trtcache, os.path.join(tmp, "cache"), a.timeout, a.memory_limit)
    print(json.dumps(r), flush=True)
    if a.json:
        json.dump(r, open(a.json, "w"), indent=1)
    if not a.keep:
        shutil.rmtree(d)


def report(a):
    """One summary and table from `check` and `big` JSON files."""
    results = []
    for f in a.files:
        j = json.load(open(f))
        results += j["results"] if "results" in j else [j]
    out = {"summary": summary(results), "results": results}
    if a.json:
        json.dump(out, open(a.json, "w"), indent=1)
    if a.md:
        open(a.md, "w").write(md_table(results))
    print(json.dumps(out["summary"], indent=1))


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("make")
    m.add_argument("dest")
    m.add_argument("--only")
    m.add_argument("--steps", default="optimum,diffusers,fp16,hummingbird")
    for name in ("check", "big"):
        c = sub.add_parser(name)
        c.add_argument("dest")
        c.add_argument("--trtcache", default=os.path.join(HERE, "../../target/release/trtcache"))
        c.add_argument("--only")
        c.add_argument("--json")
        c.add_argument("--md")
        c.add_argument("--timeout", type=int, default=1800)
        c.add_argument("--tmp", help="folder for the temporary cache (default: $TMPDIR)")
        c.add_argument("--keep", action="store_true", help="big: keep the model")
        c.add_argument("--memory-limit", help="trtcache build --memory-limit (e.g. 8G on a shared machine)")
    r = sub.add_parser("report", help="merge check/big JSON files into one summary and table")
    r.add_argument("files", nargs="+")
    r.add_argument("--json")
    r.add_argument("--md")
    a = ap.parse_args()
    {"make": make, "check": check, "big": big, "report": report}[a.cmd](a)


if __name__ == "__main__":
    main()
