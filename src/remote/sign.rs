//! Ed25519 keys and signatures in Nix's format: a named key is `NAME:BASE64`, where the
//! secret key file holds the 64-byte keypair and the public key file the 32-byte key. A
//! signature names the key that made it, so trusting several keys at once is how keys rotate.

use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD as B64;
use base64::Engine;
use ed25519_dalek::{Signer as _, SigningKey, VerifyingKey};
use serde::{Deserialize, Serialize};

use super::RemoteError;

/// A secret key with its name.
pub struct NamedSigningKey {
    pub name: String,
    key: SigningKey,
}

impl std::fmt::Debug for NamedSigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "NamedSigningKey({})", self.name)
    }
}

/// A trusted public key with its name.
#[derive(Clone, Debug)]
pub struct NamedPublicKey {
    pub name: String,
    key: VerifyingKey,
}

/// One signature over a manifest's bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Signature {
    /// The name of the key that signed.
    pub key: String,
    /// Base64 of the 64-byte Ed25519 signature.
    pub sig: String,
}

fn bad(path: &Path, why: impl std::fmt::Display) -> RemoteError {
    RemoteError::Key {
        path: path.to_path_buf(),
        message: why.to_string(),
    }
}

fn split_named(text: &str) -> Option<(&str, &str)> {
    let (name, b64) = text.trim().split_once(':')?;
    (!name.is_empty() && !name.contains(char::is_whitespace)).then_some((name, b64))
}

fn valid_name(name: &str) -> bool {
    !name.is_empty()
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c))
}

impl NamedSigningKey {
    /// Reads a secret key file (`NAME:BASE64` of the 64-byte keypair).
    pub fn load(path: &Path) -> Result<Self, RemoteError> {
        let text = std::fs::read_to_string(path).map_err(|e| bad(path, e))?;
        let (name, b64) = split_named(&text).ok_or_else(|| bad(path, "not NAME:BASE64"))?;
        let raw = B64.decode(b64).map_err(|e| bad(path, e))?;
        let bytes: [u8; 64] = raw
            .try_into()
            .map_err(|_| bad(path, "an Ed25519 secret key is 64 bytes"))?;
        let key = SigningKey::from_keypair_bytes(&bytes).map_err(|e| bad(path, e))?;
        Ok(Self {
            name: name.into(),
            key,
        })
    }

    /// Signs `msg`.
    pub fn sign(&self, msg: &[u8]) -> Signature {
        Signature {
            key: self.name.clone(),
            sig: B64.encode(self.key.sign(msg).to_bytes()),
        }
    }

    /// The public half, with the same name.
    pub fn public(&self) -> NamedPublicKey {
        NamedPublicKey {
            name: self.name.clone(),
            key: self.key.verifying_key(),
        }
    }
}

impl NamedPublicKey {
    /// Reads a public key file (`NAME:BASE64` of the 32-byte key).
    pub fn load(path: &Path) -> Result<Self, RemoteError> {
        let text = std::fs::read_to_string(path).map_err(|e| bad(path, e))?;
        Self::parse(&text).map_err(|m| bad(path, m))
    }

    /// Parses `NAME:BASE64`.
    pub fn parse(text: &str) -> Result<Self, String> {
        let (name, b64) = split_named(text).ok_or("not NAME:BASE64")?;
        let raw = B64.decode(b64).map_err(|e| e.to_string())?;
        let bytes: [u8; 32] = raw
            .try_into()
            .map_err(|_| "an Ed25519 public key is 32 bytes")?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|e| e.to_string())?;
        Ok(Self {
            name: name.into(),
            key,
        })
    }

    /// `NAME:BASE64`, the public key file's content.
    pub fn encode(&self) -> String {
        format!("{}:{}", self.name, B64.encode(self.key.as_bytes()))
    }

    /// Whether `sig` is this key's valid signature over `msg` (strict verification: no
    /// malleable or weak-key signatures).
    pub fn verifies(&self, msg: &[u8], sig: &Signature) -> bool {
        if sig.key != self.name {
            return false;
        }
        let Ok(raw) = B64.decode(&sig.sig) else {
            return false;
        };
        let Ok(bytes) = <[u8; 64]>::try_from(raw) else {
            return false;
        };
        let s = ed25519_dalek::Signature::from_bytes(&bytes);
        self.key.verify_strict(msg, &s).is_ok()
    }
}

/// What [`keygen`] wrote.
#[derive(Clone, Debug, Serialize)]
pub struct KeygenReport {
    pub name: String,
    pub secret_key: PathBuf,
    pub public_key: PathBuf,
    /// The public key file's content, to paste into other hosts' key files.
    pub public: String,
}

/// Writes a new keypair: `PATH.key` (mode 0600, never overwritten) and `PATH.pub`. The key's
/// name is PATH's file name (`ci-builder` for `/etc/trtcache/keys/ci-builder`).
pub fn keygen(path: &Path) -> Result<KeygenReport, RemoteError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    if !valid_name(&name) {
        return Err(bad(
            path,
            "the file name is the key's name: letters, digits, `-`, `_` and `.` only",
        ));
    }
    let mut seed = [0u8; 32];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut seed))
        .map_err(|e| bad(Path::new("/dev/urandom"), e))?;
    let key = SigningKey::from_bytes(&seed);
    let with_ext = |ext: &str| {
        let mut p = path.as_os_str().to_owned();
        p.push(ext);
        PathBuf::from(p)
    };
    let (secret, public) = (with_ext(".key"), with_ext(".pub"));
    let pubkey = NamedPublicKey {
        name: name.clone(),
        key: key.verifying_key(),
    }
    .encode();
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&secret)
        .map_err(|e| bad(&secret, e))?;
    f.write_all(format!("{name}:{}\n", B64.encode(key.to_keypair_bytes())).as_bytes())
        .and_then(|_| f.sync_all())
        .map_err(|e| bad(&secret, e))?;
    std::fs::write(&public, format!("{pubkey}\n")).map_err(|e| bad(&public, e))?;
    Ok(KeygenReport {
        name,
        secret_key: secret,
        public_key: public,
        public: pubkey,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keygen_sign_verify_and_refuse() {
        let d = tempfile::tempdir().unwrap();
        let r = keygen(&d.path().join("ci-builder")).unwrap();
        let mode = std::fs::metadata(&r.secret_key)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(
            keygen(&d.path().join("ci-builder")).is_err(),
            "never overwrites"
        );
        let sk = NamedSigningKey::load(&r.secret_key).unwrap();
        let pk = NamedPublicKey::load(&r.public_key).unwrap();
        assert_eq!(pk.name, "ci-builder");
        let sig = sk.sign(b"manifest");
        assert!(pk.verifies(b"manifest", &sig));
        assert!(!pk.verifies(b"manifesT", &sig));
        let renamed = Signature {
            key: "other".into(),
            ..sig.clone()
        };
        assert!(!pk.verifies(b"manifest", &renamed));
        let other = keygen(&d.path().join("other")).unwrap();
        let opk = NamedPublicKey::load(&other.public_key).unwrap();
        assert!(!opk.verifies(b"manifest", &renamed));
        assert!(NamedPublicKey::parse("x:AAAA").is_err());
        assert!(keygen(&d.path().join("bad name")).is_err());
    }
}
