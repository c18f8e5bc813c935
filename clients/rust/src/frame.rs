//! Framing and descriptor passing: a frame is a 4-byte big-endian length followed by that
//! many bytes of JSON. Descriptors travel as `SCM_RIGHTS` ancillary data on the `sendmsg` that
//! carries the frame's first bytes; the reader collects every descriptor that arrives while it
//! reads a frame. Functions here work on raw descriptors so that both the blocking client and
//! the daemon's non-blocking sockets can use them.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};

use serde::Serialize;

/// Most descriptors one frame may carry (a graph plus its external-data files).
pub const MAX_FDS: usize = 32;

/// Errors of reading or writing a frame.
#[derive(Debug)]
pub enum FrameError {
    /// The peer closed the connection between frames.
    Closed,
    /// The peer announced a frame longer than the limit.
    TooLarge {
        /// Announced length.
        len: u32,
        /// Limit.
        max: u32,
    },
    /// The body is not valid JSON for the expected type.
    Json(serde_json::Error),
    /// A socket error (including a connection closed inside a frame).
    Io(io::Error),
    /// The kernel dropped descriptors that came with the frame (`MSG_CTRUNC`): this process
    /// is at its open-files limit (`RLIMIT_NOFILE`), or the peer sent more than [`MAX_FDS`].
    /// The frame itself was read whole and the descriptors that did arrive were closed, so
    /// the connection stays in step.
    DescriptorsTruncated {
        /// Descriptors that arrived (and were closed).
        received: usize,
        /// This process's soft `RLIMIT_NOFILE` when it happened, if it could be read.
        nofile_limit: Option<u64>,
    },
}

impl std::fmt::Display for FrameError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            FrameError::Closed => f.write_str("connection closed"),
            FrameError::TooLarge { len, max } => {
                write!(f, "frame of {len} bytes exceeds the limit of {max}")
            }
            FrameError::Json(e) => write!(f, "malformed frame: {e}"),
            FrameError::Io(e) if is_timeout(e) => {
                f.write_str("no answer from the daemon within the connection's timeout")
            }
            FrameError::Io(e) => write!(f, "socket error: {e}"),
            FrameError::DescriptorsTruncated {
                received,
                nofile_limit,
            } => {
                write!(
                    f,
                    "the kernel dropped descriptors sent with the frame (MSG_CTRUNC; {received} \
                     arrived and were closed): this process is at its open-files limit \
                     (RLIMIT_NOFILE soft limit "
                )?;
                match nofile_limit {
                    Some(n) => write!(f, "{n}")?,
                    None => f.write_str("unknown")?,
                }
                write!(f, ") or the peer sent more than {MAX_FDS}")
            }
        }
    }
}

impl std::error::Error for FrameError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            FrameError::Json(e) => Some(e),
            FrameError::Io(e) => Some(e),
            _ => None,
        }
    }
}

/// Whether a socket error is a read or write timeout (`SO_RCVTIMEO`/`SO_SNDTIMEO` report
/// `EAGAIN`).
pub fn is_timeout(e: &io::Error) -> bool {
    matches!(
        e.kind(),
        io::ErrorKind::WouldBlock | io::ErrorKind::TimedOut
    )
}

fn nofile_limit() -> Option<u64> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit with a valid pointer to a local rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return None;
    }
    #[allow(clippy::unnecessary_cast)] // rlim_t is u64 here, u32 on some 32-bit targets
    Some(lim.rlim_cur as u64)
}

impl From<io::Error> for FrameError {
    fn from(e: io::Error) -> Self {
        FrameError::Io(e)
    }
}

/// Encodes a message as one frame (length prefix + JSON).
pub fn encode<T: Serialize>(msg: &T) -> Result<Vec<u8>, FrameError> {
    let json = serde_json::to_vec(msg).map_err(FrameError::Json)?;
    let len = u32::try_from(json.len()).map_err(|_| FrameError::TooLarge {
        len: u32::MAX,
        max: u32::MAX,
    })?;
    let mut out = Vec::with_capacity(4 + json.len());
    out.extend_from_slice(&len.to_be_bytes());
    out.extend_from_slice(&json);
    Ok(out)
}

fn cmsg_space(n: usize) -> usize {
    // SAFETY: CMSG_SPACE is a pure size computation.
    unsafe { libc::CMSG_SPACE((n * std::mem::size_of::<RawFd>()) as u32) as usize }
}

/// One `sendmsg` of (a prefix of) `buf` with `fds` attached; returns bytes sent. Works on
/// blocking and non-blocking sockets (then it may fail with `WouldBlock`).
pub fn send_with_fds(sock: RawFd, buf: &[u8], fds: &[RawFd]) -> io::Result<usize> {
    if fds.len() > MAX_FDS {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("{} descriptors exceed the limit of {MAX_FDS}", fds.len()),
        ));
    }
    let mut iov = libc::iovec {
        iov_base: buf.as_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    // u64 elements keep the control buffer aligned for cmsghdr.
    let mut control = vec![0u64; cmsg_space(fds.len()).div_ceil(8).max(1)];
    // SAFETY: msghdr is plain data; every pointer set below outlives the sendmsg call.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    if !fds.is_empty() {
        msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
        msg.msg_controllen = cmsg_space(fds.len()) as _;
        // SAFETY: the control buffer is large enough for one cmsghdr with fds.len() fds.
        unsafe {
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(fds) as u32) as _;
            std::ptr::copy_nonoverlapping(
                fds.as_ptr(),
                libc::CMSG_DATA(c) as *mut RawFd,
                fds.len(),
            );
        }
    }
    // SAFETY: msg points at valid buffers for the duration of the call.
    let n = unsafe { libc::sendmsg(sock, &msg, libc::MSG_NOSIGNAL) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(n as usize)
}

/// One `recvmsg` into `buf`; descriptors that arrive are appended to `fds` (close-on-exec).
/// Returns bytes read (0 at end of stream). Descriptors the kernel dropped (`MSG_CTRUNC`)
/// make this an error after the bytes were consumed; [`read_frame`] instead finishes the
/// frame and reports [`FrameError::DescriptorsTruncated`].
pub fn recv_with_fds(sock: RawFd, buf: &mut [u8], fds: &mut Vec<OwnedFd>) -> io::Result<usize> {
    let (n, truncated) = recv_with_fds_flagged(sock, buf, fds)?;
    if truncated {
        return Err(io::Error::other(format!(
            "descriptors dropped by the kernel (MSG_CTRUNC): at the open-files limit, or more \
             than {MAX_FDS} in one frame"
        )));
    }
    Ok(n)
}

/// Like [`recv_with_fds`], returning whether the kernel dropped descriptors (`MSG_CTRUNC`)
/// instead of failing, so the caller can finish reading the frame.
pub fn recv_with_fds_flagged(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
) -> io::Result<(usize, bool)> {
    let mut iov = libc::iovec {
        iov_base: buf.as_mut_ptr() as *mut libc::c_void,
        iov_len: buf.len(),
    };
    let space = cmsg_space(MAX_FDS);
    let mut control = vec![0u64; space.div_ceil(8)];
    // SAFETY: as in send_with_fds.
    let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
    msg.msg_iov = &mut iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
    msg.msg_controllen = space as _;
    // SAFETY: msg points at valid buffers for the duration of the call.
    let n = unsafe { libc::recvmsg(sock, &mut msg, libc::MSG_CMSG_CLOEXEC) };
    if n < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: walking the control messages the kernel wrote into our buffer.
    unsafe {
        let mut c = libc::CMSG_FIRSTHDR(&msg);
        while !c.is_null() {
            if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(c) as *const RawFd;
                let bytes = (*c).cmsg_len as usize - (data as usize - c as usize);
                for i in 0..bytes / std::mem::size_of::<RawFd>() {
                    fds.push(OwnedFd::from_raw_fd(std::ptr::read_unaligned(data.add(i))));
                }
            }
            c = libc::CMSG_NXTHDR(&msg, c);
        }
    }
    Ok((n as usize, msg.msg_flags & libc::MSG_CTRUNC != 0))
}

/// Writes a whole frame on a blocking socket, with `fds` attached to its first bytes.
pub fn write_frame(sock: &impl AsRawFd, frame: &[u8], fds: &[RawFd]) -> io::Result<()> {
    let mut off = 0;
    let mut pending_fds = fds;
    while off < frame.len() {
        match send_with_fds(sock.as_raw_fd(), &frame[off..], pending_fds) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                off += n;
                pending_fds = &[];
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

fn read_exact_fds(
    sock: RawFd,
    buf: &mut [u8],
    fds: &mut Vec<OwnedFd>,
    truncated: &mut bool,
) -> Result<(), FrameError> {
    let mut off = 0;
    while off < buf.len() {
        match recv_with_fds_flagged(sock, &mut buf[off..], fds) {
            Ok((0, _)) if off == 0 => return Err(FrameError::Closed),
            Ok((0, _)) => return Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
            Ok((n, t)) => {
                off += n;
                *truncated |= t;
            }
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e.into()),
        }
    }
    Ok(())
}

/// Reads one frame from a blocking socket: the JSON body and every descriptor that came with
/// it. `Closed` when the peer hung up between frames; `DescriptorsTruncated` (with the frame
/// consumed, so the next frame reads normally) when the kernel dropped descriptors.
pub fn read_frame(sock: &impl AsRawFd, max: u32) -> Result<(Vec<u8>, Vec<OwnedFd>), FrameError> {
    let mut fds = Vec::new();
    let mut truncated = false;
    let mut len = [0u8; 4];
    read_exact_fds(sock.as_raw_fd(), &mut len, &mut fds, &mut truncated)?;
    let len = u32::from_be_bytes(len);
    if len > max {
        return Err(FrameError::TooLarge { len, max });
    }
    let mut body = vec![0u8; len as usize];
    match read_exact_fds(sock.as_raw_fd(), &mut body, &mut fds, &mut truncated) {
        Err(FrameError::Closed) => Err(FrameError::Io(io::ErrorKind::UnexpectedEof.into())),
        Err(e) => Err(e),
        Ok(()) if truncated => Err(FrameError::DescriptorsTruncated {
            received: fds.len(),
            nofile_limit: nofile_limit(),
        }),
        Ok(()) => Ok((body, fds)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::{Read, Seek, Write};
    use std::os::unix::net::UnixStream;

    #[test]
    fn frame_with_descriptors_round_trips() {
        let (a, b) = UnixStream::pair().unwrap();
        let mut f = tempfile_like();
        f.write_all(b"hello fd").unwrap();
        f.rewind().unwrap();
        let frame = encode(&serde_json::json!({"kind": "x"})).unwrap();
        write_frame(&a, &frame, &[f.as_raw_fd(), f.as_raw_fd()]).unwrap();
        let (body, fds) = read_frame(&b, 1024).unwrap();
        assert_eq!(body, br#"{"kind":"x"}"#);
        assert_eq!(fds.len(), 2);
        let mut got = String::new();
        std::fs::File::from(fds.into_iter().next().unwrap())
            .read_to_string(&mut got)
            .unwrap();
        assert_eq!(got, "hello fd");
    }

    #[test]
    fn oversized_and_closed_are_distinct() {
        let (a, b) = UnixStream::pair().unwrap();
        write_frame(&a, &100u32.to_be_bytes(), &[]).unwrap();
        assert!(matches!(
            read_frame(&b, 10),
            Err(FrameError::TooLarge { len: 100, max: 10 })
        ));
        let (a, b) = UnixStream::pair().unwrap();
        drop(a);
        assert!(matches!(read_frame(&b, 10), Err(FrameError::Closed)));
    }

    #[test]
    fn dropped_descriptors_are_reported_and_the_stream_stays_in_step() {
        // More descriptors than the reader's control buffer holds: the kernel sets
        // MSG_CTRUNC exactly as it does at RLIMIT_NOFILE (tests/it/clients.rs covers that).
        let (a, b) = UnixStream::pair().unwrap();
        let f = tempfile_like();
        let many = [f.as_raw_fd(); MAX_FDS + 8];
        let frame = encode(&serde_json::json!({"kind": "first"})).unwrap();
        let mut iov = libc::iovec {
            iov_base: frame.as_ptr() as *mut libc::c_void,
            iov_len: frame.len(),
        };
        let mut control = vec![0u64; cmsg_space(many.len()).div_ceil(8)];
        // SAFETY: as in send_with_fds, with a control buffer sized for `many`.
        let n = unsafe {
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = control.as_mut_ptr() as *mut libc::c_void;
            msg.msg_controllen = cmsg_space(many.len()) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(std::mem::size_of_val(&many[..]) as u32) as _;
            std::ptr::copy_nonoverlapping(
                many.as_ptr(),
                libc::CMSG_DATA(c) as *mut RawFd,
                many.len(),
            );
            libc::sendmsg(a.as_raw_fd(), &msg, 0)
        };
        assert_eq!(n as usize, frame.len());
        write_frame(
            &a,
            &encode(&serde_json::json!({"kind": "second"})).unwrap(),
            &[],
        )
        .unwrap();
        let e = read_frame(&b, 1024).unwrap_err();
        assert!(
            matches!(e, FrameError::DescriptorsTruncated { received, .. } if received <= MAX_FDS),
            "{e:?}"
        );
        assert!(e.to_string().contains("RLIMIT_NOFILE"), "{e}");
        let (body, fds) = read_frame(&b, 1024).unwrap();
        assert_eq!(body, br#"{"kind":"second"}"#);
        assert!(fds.is_empty());
    }

    fn tempfile_like() -> std::fs::File {
        let p = std::env::temp_dir().join(format!("trtcache-frame-test-{}", std::process::id()));
        let f = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .create(true)
            .truncate(true)
            .open(&p)
            .unwrap();
        let _ = std::fs::remove_file(&p);
        f
    }
}
