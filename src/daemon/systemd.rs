//! systemd integration by hand: `sd_notify` datagrams to `$NOTIFY_SOCKET` (READY=1, STATUS=,
//! WATCHDOG=1, STOPPING=1) and socket activation (`$LISTEN_FDS`/`$LISTEN_PID`, first fd 3).
//! Without systemd every function is a no-op.

use std::os::fd::FromRawFd;
use std::time::Duration;

/// Sends one notification; silently nothing when not run by systemd.
pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = std::os::unix::net::UnixDatagram::unbound() else {
        return;
    };
    let bytes = path.as_encoded_bytes();
    let r = if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        std::os::unix::net::SocketAddr::from_abstract_name(name)
            .and_then(|a| sock.send_to_addr(state.as_bytes(), &a))
    } else {
        sock.send_to(state.as_bytes(), &path)
    };
    if let Err(e) = r {
        tracing::debug!(error = %e, "sd_notify failed");
    }
}

/// The watchdog interval to ping at (half of `WATCHDOG_USEC`), when systemd asks for one.
pub fn watchdog_interval() -> Option<Duration> {
    if let Some(pid) = std::env::var("WATCHDOG_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
    {
        if pid != std::process::id() {
            return None;
        }
    }
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    (usec > 0).then(|| Duration::from_micros(usec / 2))
}

/// The listening socket systemd passed (socket activation), if any. Clears the variables so
/// children do not inherit them.
pub fn listener() -> std::io::Result<Option<std::os::unix::net::UnixListener>> {
    let pid_ok = std::env::var("LISTEN_PID")
        .ok()
        .and_then(|p| p.parse::<u32>().ok())
        .is_some_and(|p| p == std::process::id());
    let n: i32 = std::env::var("LISTEN_FDS")
        .ok()
        .and_then(|n| n.parse().ok())
        .unwrap_or(0);
    std::env::remove_var("LISTEN_PID");
    std::env::remove_var("LISTEN_FDS");
    std::env::remove_var("LISTEN_FDNAMES");
    if !pid_ok || n < 1 {
        return Ok(None);
    }
    const FD: i32 = 3;
    // SAFETY: systemd hands fd 3 to this process; checking it is a Unix stream socket below.
    let mut ty: libc::c_int = 0;
    let mut len = std::mem::size_of::<libc::c_int>() as libc::socklen_t;
    let ok = unsafe {
        libc::getsockopt(
            FD,
            libc::SOL_SOCKET,
            libc::SO_TYPE,
            &mut ty as *mut _ as *mut libc::c_void,
            &mut len,
        )
    };
    if ok != 0 || ty != libc::SOCK_STREAM {
        return Err(std::io::Error::other(
            "LISTEN_FDS fd 3 is not a stream socket",
        ));
    }
    // SAFETY: fd 3 is ours (LISTEN_PID matched) and a stream socket.
    let l = unsafe { std::os::unix::net::UnixListener::from_raw_fd(FD) };
    l.set_nonblocking(true)?;
    Ok(Some(l))
}
