//! The `DT_NEEDED` entries of a shared library, read from its ELF dynamic section without
//! loading it: what the loader uses to learn which TensorRT major a shim was linked against
//! (`libnvinfer.so.MAJOR`) before anything of it runs.
//!
//! Enters: a file's bytes. Leaves: the sonames it needs, in file order, or a message saying
//! why the file is not a readable ELF shared library. Every offset is bounds-checked: a
//! truncated or hostile file is an error, never a panic.

use std::path::Path;

const PT_LOAD: u32 = 1;
const PT_DYNAMIC: u32 = 2;
const DT_NULL: u64 = 0;
const DT_NEEDED: u64 = 1;
const DT_STRTAB: u64 = 5;
const DT_STRSZ: u64 = 10;

/// The sonames `path` names in `DT_NEEDED` entries.
pub(crate) fn needed(path: &Path) -> Result<Vec<String>, String> {
    let data = std::fs::read(path).map_err(|e| e.to_string())?;
    parse_needed(&data)
}

struct Reader<'a> {
    data: &'a [u8],
    wide: bool,
    big_endian: bool,
}

impl Reader<'_> {
    fn bytes<const N: usize>(&self, at: u64) -> Result<[u8; N], String> {
        let start = usize::try_from(at).map_err(|_| "offset out of range".to_string())?;
        start
            .checked_add(N)
            .and_then(|end| self.data.get(start..end))
            .and_then(|s| <[u8; N]>::try_from(s).ok())
            .ok_or_else(|| format!("truncated at offset {at}"))
    }

    fn u16(&self, at: u64) -> Result<u64, String> {
        let b = self.bytes::<2>(at)?;
        Ok(u64::from(if self.big_endian {
            u16::from_be_bytes(b)
        } else {
            u16::from_le_bytes(b)
        }))
    }

    fn u32(&self, at: u64) -> Result<u64, String> {
        let b = self.bytes::<4>(at)?;
        Ok(u64::from(if self.big_endian {
            u32::from_be_bytes(b)
        } else {
            u32::from_le_bytes(b)
        }))
    }

    fn u64(&self, at: u64) -> Result<u64, String> {
        let b = self.bytes::<8>(at)?;
        Ok(if self.big_endian {
            u64::from_be_bytes(b)
        } else {
            u64::from_le_bytes(b)
        })
    }

    /// An address-sized field (`Elf64_Addr`/`Elf32_Addr` and friends).
    fn word(&self, at: u64) -> Result<u64, String> {
        if self.wide {
            self.u64(at)
        } else {
            self.u32(at)
        }
    }
}

struct Segment {
    kind: u32,
    offset: u64,
    vaddr: u64,
    filesz: u64,
}

fn segments(r: &Reader<'_>) -> Result<Vec<Segment>, String> {
    let (phoff, phentsize, phnum) = if r.wide {
        (r.u64(0x20)?, r.u16(0x36)?, r.u16(0x38)?)
    } else {
        (r.u32(0x1c)?, r.u16(0x2a)?, r.u16(0x2c)?)
    };
    let mut out = Vec::new();
    for i in 0..phnum {
        let at = i
            .checked_mul(phentsize)
            .and_then(|o| o.checked_add(phoff))
            .ok_or("program header out of range")?;
        let seg = if r.wide {
            Segment {
                kind: r.u32(at)? as u32,
                offset: r.u64(at + 8)?,
                vaddr: r.u64(at + 16)?,
                filesz: r.u64(at + 32)?,
            }
        } else {
            Segment {
                kind: r.u32(at)? as u32,
                offset: r.u32(at + 4)?,
                vaddr: r.u32(at + 8)?,
                filesz: r.u32(at + 16)?,
            }
        };
        out.push(seg);
    }
    Ok(out)
}

/// The file offset of virtual address `addr`, through the `PT_LOAD` segment that maps it.
fn file_offset(segs: &[Segment], addr: u64) -> Option<u64> {
    segs.iter()
        .filter(|s| s.kind == PT_LOAD)
        .find(|s| addr >= s.vaddr && addr - s.vaddr < s.filesz)
        .and_then(|s| s.offset.checked_add(addr - s.vaddr))
}

/// The `DT_NEEDED` sonames of an ELF shared library held in `data`.
pub(crate) fn parse_needed(data: &[u8]) -> Result<Vec<String>, String> {
    if data.get(..4) != Some(b"\x7fELF") {
        return Err("not an ELF file".into());
    }
    let wide = match data.get(4) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err("unknown ELF class".into()),
    };
    let big_endian = match data.get(5) {
        Some(1) => false,
        Some(2) => true,
        _ => return Err("unknown ELF byte order".into()),
    };
    let r = Reader {
        data,
        wide,
        big_endian,
    };
    let segs = segments(&r)?;
    let Some(dynamic) = segs.iter().find(|s| s.kind == PT_DYNAMIC) else {
        return Err("no dynamic section (not a shared library)".into());
    };
    let entry = if wide { 16 } else { 8 };
    let (mut needed_offsets, mut strtab, mut strsz) = (Vec::new(), None, None);
    let mut at = dynamic.offset;
    let end = dynamic
        .offset
        .checked_add(dynamic.filesz)
        .ok_or("dynamic section out of range")?;
    while at.checked_add(entry).is_some_and(|e| e <= end) {
        let tag = r.word(at)?;
        let val = r.word(at + entry / 2)?;
        match tag {
            DT_NULL => break,
            DT_NEEDED => needed_offsets.push(val),
            DT_STRTAB => strtab = Some(val),
            DT_STRSZ => strsz = Some(val),
            _ => {}
        }
        at += entry;
    }
    if needed_offsets.is_empty() {
        return Ok(Vec::new());
    }
    let strtab = strtab.ok_or("DT_NEEDED without a string table")?;
    let table = file_offset(&segs, strtab).ok_or("the string table is not in the file")?;
    let table_end = strsz
        .and_then(|s| table.checked_add(s))
        .map_or(data.len(), |e| {
            usize::try_from(e).unwrap_or(usize::MAX).min(data.len())
        });
    needed_offsets
        .into_iter()
        .map(|o| {
            let start = table
                .checked_add(o)
                .and_then(|s| usize::try_from(s).ok())
                .filter(|&s| s < table_end)
                .ok_or("a DT_NEEDED name outside the string table")?;
            let bytes = &data[start..table_end];
            let len = bytes
                .iter()
                .position(|&b| b == 0)
                .ok_or("an unterminated DT_NEEDED name")?;
            Ok(String::from_utf8_lossy(&bytes[..len]).into_owned())
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_needed_libraries_of_a_real_binary() {
        // This test binary is an ELF executable linked against the C library.
        let exe = std::env::current_exe().unwrap();
        let names = needed(&exe).unwrap();
        assert!(names.iter().any(|n| n.starts_with("libc.so.")), "{names:?}");
    }

    #[test]
    fn malformed_files_are_errors_not_panics() {
        let exe = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert_eq!(parse_needed(b"").unwrap_err(), "not an ELF file");
        assert_eq!(parse_needed(b"#!/bin/sh\n").unwrap_err(), "not an ELF file");
        // Every truncation of a real file: an answer or an error, never a panic.
        for len in (0..exe.len().min(4096)).step_by(7) {
            let _ = parse_needed(&exe[..len]);
        }
        // Garbage program-header fields.
        let mut bad = exe.clone();
        bad[0x20..0x28].copy_from_slice(&u64::MAX.to_le_bytes());
        assert!(parse_needed(&bad).is_err());
        let mut bad = exe;
        bad[4] = 9;
        assert_eq!(parse_needed(&bad).unwrap_err(), "unknown ELF class");
    }
}
