//! Whether a file may be loaded as code by this process: the one check every library trtcache
//! `dlopen`s (ONNX Runtime, TensorRT's shim and libraries found in configured folders) and
//! every Python interpreter it runs passes first.
//!
//! A library's constructor runs with the loader's rights, so a file that another user can
//! write, or can replace through a folder they can write, is that user's code running as us
//! (as root, under `sudo trtcache build`). The rule: the file and every folder on its resolved
//! path belong to root or to this process's effective user, and none is writable by group or
//! others, except a folder with the sticky bit (`/tmp`), where others cannot rename or delete
//! what they do not own (the next component down must then pass the rule itself).
//!
//! Enters: a path. Leaves: the resolved path to load (symlinks followed once, here, so what is
//! checked is what is loaded) or an [`Untrusted`] naming the component and why.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};

/// Why a path may not be loaded.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}: refusing to load it: {why}", .component.display())]
pub struct Untrusted {
    /// The file or folder that fails the rule (or the path that cannot be resolved).
    pub component: PathBuf,
    /// What is wrong with it.
    pub why: String,
}

/// This process's effective user.
pub fn effective_uid() -> u32 {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() }
}

/// Resolves `path` and checks it and every folder above it (see the module header). Returns
/// the resolved path: load that one, not `path`, so a link swapped after the check is not
/// followed.
pub fn trusted_file(path: &Path) -> Result<PathBuf, Untrusted> {
    trusted_file_for(path, effective_uid())
}

/// [`trusted_file`] for the user `uid` (tests check other users' rules with it).
pub fn trusted_file_for(path: &Path, uid: u32) -> Result<PathBuf, Untrusted> {
    let real = std::fs::canonicalize(path).map_err(|e| Untrusted {
        component: path.to_path_buf(),
        why: format!("cannot resolve it: {e}"),
    })?;
    let meta = std::fs::metadata(&real).map_err(|e| Untrusted {
        component: real.clone(),
        why: e.to_string(),
    })?;
    if !meta.is_file() {
        return Err(Untrusted {
            component: real,
            why: "not a regular file".into(),
        });
    }
    check_ancestors(real, uid)
}

/// [`trusted_file`] for a folder whose files are loaded as code, or that is put on a
/// library search path (an incoming TensorRT's `ROOT/lib`): it and every folder above it,
/// and every entry in it (each file, and what each link resolves to, by [`trusted_file`]'s
/// rule; a link that resolves nowhere is refused too, as its target could be created later).
/// A folder root owns can still hold a file a co-tenant owns (a tarball extracted as root
/// keeps its archive's owners), and the loader would take that file by name.
pub fn trusted_dir(path: &Path) -> Result<PathBuf, Untrusted> {
    let real = std::fs::canonicalize(path).map_err(|e| Untrusted {
        component: path.to_path_buf(),
        why: format!("cannot resolve it: {e}"),
    })?;
    if !real.is_dir() {
        return Err(Untrusted {
            component: real,
            why: "not a folder".into(),
        });
    }
    let uid = effective_uid();
    let real = check_ancestors(real, uid)?;
    let entries = std::fs::read_dir(&real).map_err(|e| Untrusted {
        component: real.clone(),
        why: format!("cannot list it: {e}"),
    })?;
    for entry in entries {
        let entry = entry.map_err(|e| Untrusted {
            component: real.clone(),
            why: format!("cannot list it: {e}"),
        })?;
        let p = entry.path();
        let target = std::fs::canonicalize(&p).map_err(|e| Untrusted {
            component: p.clone(),
            why: format!("cannot resolve it: {e}"),
        })?;
        check_ancestors(target, uid)?;
    }
    Ok(real)
}

/// `real` and every folder above it pass [`check_owner_and_mode`].
fn check_ancestors(real: PathBuf, uid: u32) -> Result<PathBuf, Untrusted> {
    for component in real.ancestors() {
        if component.as_os_str().is_empty() {
            continue;
        }
        let m = std::fs::metadata(component).map_err(|e| Untrusted {
            component: component.to_path_buf(),
            why: e.to_string(),
        })?;
        check_owner_and_mode(component, m.uid(), m.mode(), m.is_dir(), uid)?;
    }
    Ok(real)
}

/// The rule for one component: owned by root or `uid`; not writable by group or others,
/// unless it is a sticky folder.
fn check_owner_and_mode(
    component: &Path,
    owner: u32,
    mode: u32,
    is_dir: bool,
    uid: u32,
) -> Result<(), Untrusted> {
    let fail = |why: String| {
        Err(Untrusted {
            component: component.to_path_buf(),
            why,
        })
    };
    if owner != 0 && owner != uid {
        return fail(format!(
            "owned by uid {owner}, not by root or by this process's user (uid {uid})"
        ));
    }
    let sticky = is_dir && mode & libc::S_ISVTX != 0;
    if mode & 0o022 != 0 && !sticky {
        let who = match (mode & 0o020 != 0, mode & 0o002 != 0) {
            (true, true) => "its group and all users",
            (true, false) => "its group",
            _ => "all users",
        };
        return fail(format!(
            "writable by {who} (mode {:04o}); only root or uid {uid} may be able to change code this process loads",
            mode & 0o7777
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    fn chmod(p: &Path, mode: u32) {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).unwrap();
    }

    #[test]
    fn own_private_file_is_trusted_and_resolved() {
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("libx.so");
        std::fs::write(&f, b"").unwrap();
        chmod(&f, 0o644);
        let link = d.path().join("liblink.so");
        std::os::unix::fs::symlink(&f, &link).unwrap();
        let got = trusted_file(&link).unwrap();
        assert_eq!(got, std::fs::canonicalize(&f).unwrap());
    }

    #[test]
    fn writable_file_or_folder_is_refused() {
        let d = tempfile::tempdir().unwrap();
        let sub = d.path().join("venv");
        std::fs::create_dir(&sub).unwrap();
        let f = sub.join("libx.so");
        std::fs::write(&f, b"").unwrap();
        chmod(&f, 0o666);
        let e = trusted_file(&f).unwrap_err();
        assert!(e.why.contains("all users"), "{e}");
        chmod(&f, 0o644);
        chmod(&sub, 0o775);
        let e = trusted_file(&f).unwrap_err();
        assert_eq!(e.component, std::fs::canonicalize(&sub).unwrap(), "{e}");
        assert!(e.why.contains("its group"), "{e}");
        // A sticky world-writable folder (like /tmp) is fine: its entries cannot be swapped.
        chmod(&sub, 0o1777);
        assert!(trusted_file(&f).is_ok());
    }

    #[test]
    fn other_owner_is_refused() {
        // The rule for a user who owns neither the file nor its folders: the temp files are
        // ours (or root's when tests run as root), so ask for uid 4242's view.
        let d = tempfile::tempdir().unwrap();
        let f = d.path().join("libx.so");
        std::fs::write(&f, b"").unwrap();
        let me = effective_uid();
        if me == 0 {
            // Root: chown to another user and check our own rule refuses it.
            let c = std::ffi::CString::new(f.to_str().unwrap()).unwrap();
            // SAFETY: valid C string; chown of our own temp file.
            assert_eq!(unsafe { libc::chown(c.as_ptr(), 4242, 4242) }, 0);
            let e = trusted_file(&f).unwrap_err();
            assert!(e.why.contains("uid 4242"), "{e}");
        } else {
            let e = trusted_file_for(&f, me + 1).unwrap_err();
            assert!(e.why.contains(&format!("uid {me}")), "{e}");
        }
    }

    #[test]
    fn missing_file_is_refused_with_its_path() {
        let e = trusted_file(Path::new("/nonexistent/libx.so")).unwrap_err();
        assert!(e.why.contains("cannot resolve"), "{e}");
    }

    #[test]
    fn a_folder_on_a_library_path_passes_the_same_rule() {
        let d = tempfile::tempdir().unwrap();
        let lib = d.path().join("lib");
        std::fs::create_dir(&lib).unwrap();
        chmod(&lib, 0o755);
        assert_eq!(
            trusted_dir(&lib).unwrap(),
            std::fs::canonicalize(&lib).unwrap()
        );
        // A file in it that others may write, or a link to one elsewhere: refused by name.
        let so = lib.join("libnvinfer.so.10");
        std::fs::write(&so, b"").unwrap();
        chmod(&so, 0o644);
        assert!(trusted_dir(&lib).is_ok());
        chmod(&so, 0o666);
        let e = trusted_dir(&lib).unwrap_err();
        assert_eq!(e.component, std::fs::canonicalize(&so).unwrap(), "{e}");
        chmod(&so, 0o644);
        let open = d.path().join("open");
        std::fs::create_dir(&open).unwrap();
        chmod(&open, 0o777);
        std::fs::write(open.join("libx.so"), b"").unwrap();
        std::os::unix::fs::symlink(open.join("libx.so"), lib.join("libx.so")).unwrap();
        assert!(trusted_dir(&lib).unwrap_err().component.ends_with("open"));
        std::fs::remove_file(lib.join("libx.so")).unwrap();
        std::os::unix::fs::symlink(open.join("gone.so"), lib.join("libgone.so")).unwrap();
        assert!(trusted_dir(&lib)
            .unwrap_err()
            .why
            .contains("cannot resolve"));
        std::fs::remove_file(lib.join("libgone.so")).unwrap();
        assert!(trusted_dir(&lib).is_ok());
        chmod(&lib, 0o775);
        assert!(trusted_dir(&lib).unwrap_err().why.contains("its group"));
        let f = d.path().join("f");
        std::fs::write(&f, b"").unwrap();
        assert!(trusted_dir(&f).unwrap_err().why.contains("not a folder"));
    }

    #[test]
    fn folder_is_not_a_library() {
        let d = tempfile::tempdir().unwrap();
        let e = trusted_file(d.path()).unwrap_err();
        assert!(e.why.contains("not a regular file"), "{e}");
    }
}
