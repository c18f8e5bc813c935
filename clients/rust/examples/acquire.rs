//! Acquires a model's artifact from a running daemon and prints its metadata.
//!
//! ```text
//! cargo run -p trtcache-client --example acquire -- /run/trtcache/trtcache.sock tiny_encoder
//! ```

use trtcache_client::{AcquireRequest, Client};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(socket), Some(model)) = (args.next(), args.next()) else {
        eprintln!("usage: acquire SOCKET MODEL [BACKEND]");
        std::process::exit(2);
    };
    let mut client = Client::connect(&socket)?;
    let artifact = client.acquire(&AcquireRequest {
        model,
        backend: args.next(),
        wait: true,
        ..Default::default()
    })?;
    println!("{}", serde_json::to_string_pretty(&artifact.metadata)?);
    for (f, p) in artifact.metadata.files.iter().zip(artifact.proc_paths()) {
        println!(
            "{} {} ({} bytes) at {}",
            f.role,
            f.name,
            f.bytes,
            p.display()
        );
    }
    Ok(())
}
