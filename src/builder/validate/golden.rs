//! Golden validation inputs from a NumPy `.npz` file (as written by `np.savez` or
//! `np.savez_compressed`): one array per model input, by input name.
//!
//! Enters: the `.npz` path. Leaves: name → [`GoldenArray`] (shape + typed data), or a
//! [`ValidateError::Invalid`] naming the file and what is wrong. Stored and deflated members
//! are read, ZIP64 included (a deflated member may not inflate past the size its header
//! declares). Every numpy dtype that maps to an ONNX tensor type is accepted: floats (f2, f4,
//! f8), signed and unsigned integers of every width, bools, complex (c8, c16), fixed-width
//! strings (`U`, `S`) and object arrays of strings (their pickle is read, nothing is
//! executed); bfloat16 inputs take `uint16` arrays of the raw bits. Arrays must be
//! little-endian (or single-byte), C order.

use std::collections::BTreeMap;
use std::path::Path;

use super::error::ValidateError;

/// Typed array data.
#[derive(Clone, Debug, PartialEq)]
pub enum GoldenData {
    /// Fixed-width elements: the ONNX element type and the little-endian bytes.
    Raw {
        ty: ort::value::TensorElementType,
        bytes: Vec<u8>,
    },
    /// Strings (`U`, `S` or object arrays).
    Str(Vec<String>),
}

impl GoldenData {
    /// The numpy-style name of the element type, for messages.
    pub fn type_name(&self) -> String {
        match self {
            GoldenData::Raw { ty, .. } => {
                crate::onnx::ElemType::from_code(super::values::elem_code(*ty))
                    .name()
                    .into_owned()
            }
            GoldenData::Str(_) => "string".into(),
        }
    }
}

/// One array of the archive.
#[derive(Clone, Debug, PartialEq)]
pub struct GoldenArray {
    pub shape: Vec<i64>,
    pub data: GoldenData,
}

fn err(path: &Path, what: impl std::fmt::Display) -> ValidateError {
    ValidateError::Invalid(format!("golden inputs {}: {what}", path.display()))
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// Reads every array of an `.npz` file.
pub fn read_npz(path: &Path) -> Result<BTreeMap<String, GoldenArray>, ValidateError> {
    let bytes = std::fs::read(path).map_err(|source| ValidateError::Io {
        path: path.to_path_buf(),
        source,
    })?;
    let bad = |w: &str| err(path, w);
    // End of central directory: the last 0x06054b50 within the final 64 KiB + 22 bytes.
    let start = bytes.len().saturating_sub(65_557);
    let eocd = (start..bytes.len().saturating_sub(21))
        .rev()
        .find(|&i| u32_at(&bytes, i) == Some(0x0605_4b50))
        .ok_or_else(|| bad("not a zip archive (.npz)"))?;
    let mut entries = u16_at(&bytes, eocd + 10).unwrap_or(0) as u64;
    let mut cd = u32_at(&bytes, eocd + 16).unwrap_or(0) as u64;
    if entries == 0xFFFF || cd == 0xFFFF_FFFF {
        // ZIP64: the locator sits right before the EOCD and points at the ZIP64 record.
        let loc = eocd
            .checked_sub(20)
            .filter(|&l| u32_at(&bytes, l) == Some(0x0706_4b50))
            .ok_or_else(|| bad("ZIP64 locator missing"))?;
        let rec = u64_at(&bytes, loc + 8).ok_or_else(|| bad("truncated"))? as usize;
        if u32_at(&bytes, rec) != Some(0x0606_4b50) {
            return Err(bad("ZIP64 end record missing"));
        }
        entries = u64_at(&bytes, rec + 32).ok_or_else(|| bad("truncated"))?;
        cd = u64_at(&bytes, rec + 48).ok_or_else(|| bad("truncated"))?;
    }
    let mut out = BTreeMap::new();
    let mut at = cd as usize;
    for _ in 0..entries {
        let at_entry = at;
        let mut zip64_csize = None;
        if u32_at(&bytes, at) != Some(0x0201_4b50) {
            return Err(bad("corrupt central directory"));
        }
        let field = |o: usize| u16_at(&bytes, at + o).ok_or_else(|| bad("truncated"));
        let method = field(10)?;
        let mut size = u32_at(&bytes, at + 24).ok_or_else(|| bad("truncated"))? as u64;
        let name_len = field(28)? as usize;
        let extra_len = field(30)? as usize;
        let comment_len = field(32)? as usize;
        let mut local = u32_at(&bytes, at + 42).ok_or_else(|| bad("truncated"))? as u64;
        let name = bytes
            .get(at + 46..at + 46 + name_len)
            .map(|n| String::from_utf8_lossy(n).into_owned())
            .ok_or_else(|| bad("truncated"))?;
        // ZIP64 extra field: the 0xFFFFFFFF fields in order (uncompressed, compressed,
        // local header offset).
        let mut e = at + 46 + name_len;
        let end = e + extra_len;
        while e + 4 <= end {
            let id = u16_at(&bytes, e).unwrap_or(0);
            let len = u16_at(&bytes, e + 2).unwrap_or(0) as usize;
            if id == 1 {
                let mut p = e + 4;
                let csize32 = u32_at(&bytes, at + 20).unwrap_or(0);
                if size == 0xFFFF_FFFF {
                    size = u64_at(&bytes, p).ok_or_else(|| bad("truncated"))?;
                    p += 8;
                }
                if csize32 == 0xFFFF_FFFF {
                    zip64_csize = u64_at(&bytes, p);
                    p += 8;
                }
                if local == 0xFFFF_FFFF {
                    local = u64_at(&bytes, p).ok_or_else(|| bad("truncated"))?;
                }
            }
            e += 4 + len;
        }
        at = end + comment_len;
        if method != 0 && method != 8 {
            return Err(bad(&format!(
                "`{name}` uses zip compression method {method}; write it with np.savez or np.savez_compressed"
            )));
        }
        let csize = {
            let c = u32_at(&bytes, at_entry + 20).ok_or_else(|| bad("truncated"))? as u64;
            if c == 0xFFFF_FFFF {
                zip64_csize.unwrap_or(c)
            } else {
                c
            }
        };
        let l = local as usize;
        if u32_at(&bytes, l) != Some(0x0403_4b50) {
            return Err(bad("corrupt local header"));
        }
        let data_at = l
            + 30
            + u16_at(&bytes, l + 26).unwrap_or(0) as usize
            + u16_at(&bytes, l + 28).unwrap_or(0) as usize;
        let stored = if method == 0 { size } else { csize };
        let data = bytes
            .get(data_at..data_at.saturating_add(stored as usize))
            .ok_or_else(|| bad("truncated member"))?;
        let inflated;
        let data = if method == 8 {
            inflated = miniz_oxide::inflate::decompress_to_vec_with_limit(data, size as usize)
                .map_err(|e| err(path, format!("`{name}`: cannot inflate ({:?})", e.status)))?;
            &inflated[..]
        } else {
            data
        };
        let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
        let arr = parse_npy(data).map_err(|w| err(path, format!("`{name}`: {w}")))?;
        out.insert(key, arr);
    }
    Ok(out)
}

fn header_value<'a>(h: &'a str, key: &str) -> Option<&'a str> {
    let i = h.find(&format!("'{key}'"))?;
    let rest = h[i + key.len() + 2..]
        .trim_start()
        .strip_prefix(':')?
        .trim_start();
    Some(rest)
}

/// Parses one `.npy` member.
pub fn parse_npy(b: &[u8]) -> Result<GoldenArray, String> {
    if b.get(..6) != Some(b"\x93NUMPY".as_slice()) {
        return Err("not a .npy array".into());
    }
    let major = *b.get(6).ok_or("truncated")?;
    let (hlen, hstart) = match major {
        1 => (u16_at(b, 8).ok_or("truncated")? as usize, 10),
        2 | 3 => (u32_at(b, 8).ok_or("truncated")? as usize, 12),
        v => return Err(format!(".npy version {v} is not supported")),
    };
    let header = std::str::from_utf8(b.get(hstart..hstart + hlen).ok_or("truncated")?)
        .map_err(|_| "header is not text")?;
    let descr = header_value(header, "descr")
        .and_then(|r| r.strip_prefix('\''))
        .and_then(|r| r.split('\'').next())
        .ok_or("no descr")?;
    if header_value(header, "fortran_order").is_some_and(|r| r.starts_with("True")) {
        return Err("Fortran-order arrays are not supported; use np.ascontiguousarray".into());
    }
    let shape_src = header_value(header, "shape")
        .and_then(|r| r.strip_prefix('('))
        .and_then(|r| r.split(')').next())
        .ok_or("no shape")?;
    let shape: Vec<i64> = shape_src
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.trim_end_matches('L')
                .parse::<i64>()
                .map_err(|_| format!("bad shape `{shape_src}`"))
        })
        .collect::<Result<_, _>>()?;
    let n: usize = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d.max(0) as usize))
        .ok_or("shape too large")?;
    let raw = b.get(hstart + hlen..).ok_or("truncated")?;
    let data = parse_data(descr, n, raw)?;
    Ok(GoldenArray { shape, data })
}

fn parse_data(descr: &str, n: usize, raw: &[u8]) -> Result<GoldenData, String> {
    use ort::value::TensorElementType as T;
    let unsupported = || {
        format!(
            "dtype `{descr}` is not supported (little-endian f2/f4/f8, i1-i8, u1-u8, b1, c8/c16, U, S, or object arrays of strings)"
        )
    };
    let (order, kind) = descr.split_at(1.min(descr.len()));
    if order == ">" {
        return Err(format!(
            "dtype `{descr}` is big-endian; write the array with .astype('<{kind}')"
        ));
    }
    if kind == "O" {
        return super::pickle::object_strings(raw, n).map(GoldenData::Str);
    }
    if let Some(w) = kind.strip_prefix('U') {
        let w: usize = w.parse().map_err(|_| unsupported())?;
        let need = n.checked_mul(w * 4).ok_or("shape too large")?;
        let s = raw.get(..need).ok_or("data shorter than the shape")?;
        let out = s
            .chunks(w * 4)
            .map(|c| {
                c.chunks_exact(4)
                    .map(|u| u32::from_le_bytes(u.try_into().expect("4")))
                    .take_while(|&u| u != 0)
                    .map(|u| char::from_u32(u).ok_or("not a unicode character"))
                    .collect::<Result<String, _>>()
            })
            .collect::<Result<Vec<_>, _>>()?;
        return Ok(GoldenData::Str(if w == 0 {
            vec![String::new(); n]
        } else {
            out
        }));
    }
    if let Some(w) = kind.strip_prefix('S') {
        let w: usize = w.parse().map_err(|_| unsupported())?;
        let need = n.checked_mul(w).ok_or("shape too large")?;
        let s = raw.get(..need).ok_or("data shorter than the shape")?;
        let out = if w == 0 {
            vec![String::new(); n]
        } else {
            s.chunks(w)
                .map(|c| {
                    let end = c.iter().position(|&x| x == 0).unwrap_or(c.len());
                    String::from_utf8_lossy(&c[..end]).into_owned()
                })
                .collect()
        };
        return Ok(GoldenData::Str(out));
    }
    let ty = match kind {
        "f2" => T::Float16,
        "f4" => T::Float32,
        "f8" => T::Float64,
        "i1" => T::Int8,
        "i2" => T::Int16,
        "i4" => T::Int32,
        "i8" => T::Int64,
        "u1" => T::Uint8,
        "u2" => T::Uint16,
        "u4" => T::Uint32,
        "u8" => T::Uint64,
        "b1" => T::Bool,
        "c8" => T::Complex64,
        "c16" => T::Complex128,
        _ => return Err(unsupported()),
    };
    if !matches!(order, "<" | "|" | "=") {
        return Err(unsupported());
    }
    let need = ty.byte_size(n).ok_or_else(unsupported)?;
    let bytes = raw
        .get(..need)
        .ok_or("data shorter than the shape")?
        .to_vec();
    Ok(GoldenData::Raw { ty, bytes })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn npy(descr: &str, shape: &str, data: &[u8]) -> Vec<u8> {
        let mut h = format!("{{'descr': '{descr}', 'fortran_order': False, 'shape': {shape}, }}");
        while (10 + h.len() + 1) % 64 != 0 {
            h.push(' ');
        }
        h.push('\n');
        let mut b = b"\x93NUMPY\x01\x00".to_vec();
        b.extend((h.len() as u16).to_le_bytes());
        b.extend(h.as_bytes());
        b.extend(data);
        b
    }

    #[test]
    fn npy_headers() {
        use ort::value::TensorElementType as T;
        let raw = |ty, bytes: Vec<u8>| GoldenData::Raw { ty, bytes };
        let a = parse_npy(&npy("<f4", "(2, 2)", &[0u8; 16])).unwrap();
        assert_eq!(a.shape, vec![2, 2]);
        assert_eq!(a.data, raw(T::Float32, vec![0; 16]));
        let a = parse_npy(&npy("<i8", "(3,)", &[1, 0, 0, 0, 0, 0, 0, 0].repeat(3))).unwrap();
        assert_eq!(a.data, raw(T::Int64, [1, 0, 0, 0, 0, 0, 0, 0].repeat(3)));
        let a = parse_npy(&npy("|b1", "()", &[1])).unwrap();
        assert_eq!((a.shape.len(), a.data), (0, raw(T::Bool, vec![1])));
        for (d, ty, w) in [
            ("<f2", T::Float16, 2),
            ("<i2", T::Int16, 2),
            ("<u2", T::Uint16, 2),
            ("<u4", T::Uint32, 4),
            ("<u8", T::Uint64, 8),
            ("<c8", T::Complex64, 8),
        ] {
            let a = parse_npy(&npy(d, "(2,)", &vec![7u8; 2 * w])).unwrap();
            assert_eq!(a.data, raw(ty, vec![7; 2 * w]), "{d}");
        }
        let mut u = Vec::new();
        for c in "ab\0c\0\0".chars() {
            u.extend((c as u32).to_le_bytes());
        }
        let a = parse_npy(&npy("<U3", "(2,)", &u)).unwrap();
        assert_eq!(a.data, GoldenData::Str(vec!["ab".into(), "c".into()]));
        let a = parse_npy(&npy("|S2", "(2,)", b"hix\0")).unwrap();
        assert_eq!(a.data, GoldenData::Str(vec!["hi".into(), "x".into()]));
        let e = parse_npy(&npy(">f4", "(1,)", &[0; 4])).unwrap_err();
        assert!(e.contains("big-endian"), "{e}");
        assert!(parse_npy(&npy("<f4", "(4,)", &[0; 4])).is_err());
        assert!(parse_npy(b"junk").is_err());
    }
}
