//! Writes the fixture models (and, on request, the big benchmark models) to a folder.
//!
//! ```text
//! cargo run --release --example make_models -- OUT_DIR [--big-layers 25] [--chain 20000] [--varied 20000]
//!     [--bert-small] [--bert-exported LAYERS]
//! ```
//!
//! `--bert-small` writes `bert_small.onnx` (`BertConfig::small`, 44 MB);
//! `--bert-exported 270` writes `bert_exported_270.onnx`, the export-style narrow encoder with
//! dynamic `[batch, seq]` inputs (19,999 nodes at 270 layers).
//!
//! ```text
//! ```

use std::path::PathBuf;

use trtcache::fixtures::{bert, models, write, write_external};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let out = PathBuf::from(
        args.next()
            .ok_or("usage: make_models OUT_DIR [--big-layers N] [--chain N]")?,
    );
    std::fs::create_dir_all(&out)?;
    let mut big = None;
    let mut chains = Vec::new();
    let mut varied = Vec::new();
    let mut bert_small = false;
    let mut exported = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--bert-small" => bert_small = true,
            "--bert-exported" => exported.push(
                args.next()
                    .ok_or("--bert-exported LAYERS")?
                    .parse::<usize>()?,
            ),
            "--big-layers" => big = Some(args.next().ok_or("--big-layers N")?.parse::<usize>()?),
            "--chain" => chains.push(args.next().ok_or("--chain N")?.parse::<usize>()?),
            "--varied" => varied.push(args.next().ok_or("--varied N")?.parse::<usize>()?),
            other => return Err(format!("unknown argument {other}").into()),
        }
    }
    for (name, m) in models::all() {
        write(&m, &out.join(format!("{name}.onnx")))?;
    }
    let ext_dir = out.join("tiny_encoder_external");
    std::fs::create_dir_all(&ext_dir)?;
    write_external(
        &models::tiny_encoder(false),
        &ext_dir.join("model.onnx"),
        "model.onnx.data",
        128,
    )?;
    if let Some(layers) = big {
        write(
            &models::big_weights(layers, 2048),
            &out.join("big_weights.onnx"),
        )?;
    }
    for n in chains {
        write(&models::long_chain(n), &out.join(format!("chain_{n}.onnx")))?;
    }
    for n in varied {
        write(
            &trtcache::fixtures::capability::varied(n, 50),
            &out.join(format!("varied_{n}.onnx")),
        )?;
    }
    if bert_small {
        write(
            &bert::bert(bert::BertConfig::small()),
            &out.join("bert_small.onnx"),
        )?;
    }
    for layers in exported {
        write(
            &bert::bert_exported(bert::BertConfig::narrow(layers)),
            &out.join(format!("bert_exported_{layers}.onnx")),
        )?;
    }
    println!("wrote models to {}", out.display());
    Ok(())
}
