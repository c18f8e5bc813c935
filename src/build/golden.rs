//! Golden validation inputs from a NumPy `.npz` file (as written by `np.savez`): one array per
//! model input, by input name.
//!
//! Enters: the `.npz` path. Leaves: name → [`GoldenArray`] (shape + typed data), or a
//! [`BuildError::Validation`] naming the file and what is wrong. Only stored (uncompressed)
//! archives are read (`np.savez`, not `np.savez_compressed`), ZIP64 included; arrays must be
//! little-endian, C order.

use std::collections::BTreeMap;
use std::path::Path;

use super::BuildError;

/// Typed array data.
#[derive(Clone, Debug, PartialEq)]
pub enum GoldenData {
    F32(Vec<f32>),
    F64(Vec<f64>),
    I64(Vec<i64>),
    I32(Vec<i32>),
    I8(Vec<i8>),
    U8(Vec<u8>),
    Bool(Vec<bool>),
}

/// One array of the archive.
#[derive(Clone, Debug, PartialEq)]
pub struct GoldenArray {
    pub shape: Vec<i64>,
    pub data: GoldenData,
}

fn err(path: &Path, what: impl std::fmt::Display) -> BuildError {
    BuildError::Validation(format!("golden inputs {}: {what}", path.display()))
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
pub fn read_npz(path: &Path) -> Result<BTreeMap<String, GoldenArray>, BuildError> {
    let bytes = std::fs::read(path).map_err(|source| BuildError::Io {
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
                    p += 8;
                }
                if local == 0xFFFF_FFFF {
                    local = u64_at(&bytes, p).ok_or_else(|| bad("truncated"))?;
                }
            }
            e += 4 + len;
        }
        at = end + comment_len;
        if method != 0 {
            return Err(bad(&format!(
                "`{name}` is compressed (np.savez_compressed); write it with np.savez"
            )));
        }
        let l = local as usize;
        if u32_at(&bytes, l) != Some(0x0403_4b50) {
            return Err(bad("corrupt local header"));
        }
        let data_at = l
            + 30
            + u16_at(&bytes, l + 26).unwrap_or(0) as usize
            + u16_at(&bytes, l + 28).unwrap_or(0) as usize;
        let data = bytes
            .get(data_at..data_at + size as usize)
            .ok_or_else(|| bad("truncated member"))?;
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
    let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
    let raw = &b[hstart + hlen..];
    macro_rules! le {
        ($t:ty, $w:expr) => {{
            let need = n * $w;
            let s = raw.get(..need).ok_or("data shorter than the shape")?;
            s.chunks_exact($w)
                .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk width")))
                .collect::<Vec<$t>>()
        }};
    }
    let data = match descr {
        "<f4" => GoldenData::F32(le!(f32, 4)),
        "<f8" => GoldenData::F64(le!(f64, 8)),
        "<i8" => GoldenData::I64(le!(i64, 8)),
        "<i4" => GoldenData::I32(le!(i32, 4)),
        "|i1" => GoldenData::I8(le!(i8, 1)),
        "|u1" => GoldenData::U8(le!(u8, 1)),
        "|b1" => GoldenData::Bool(
            raw.get(..n)
                .ok_or("data shorter than the shape")?
                .iter()
                .map(|&v| v != 0)
                .collect(),
        ),
        other => {
            return Err(format!(
                "dtype `{other}` is not supported (little-endian f4, f8, i8, i4, i1, u1, b1)"
            ))
        }
    };
    Ok(GoldenArray { shape, data })
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
        let a = parse_npy(&npy("<f4", "(2, 2)", &[0u8; 16])).unwrap();
        assert_eq!(a.shape, vec![2, 2]);
        assert_eq!(a.data, GoldenData::F32(vec![0.0; 4]));
        let a = parse_npy(&npy("<i8", "(3,)", &[1, 0, 0, 0, 0, 0, 0, 0].repeat(3))).unwrap();
        assert_eq!(a.data, GoldenData::I64(vec![1, 1, 1]));
        let a = parse_npy(&npy("|b1", "()", &[1])).unwrap();
        assert_eq!((a.shape.len(), a.data), (0, GoldenData::Bool(vec![true])));
        assert!(parse_npy(&npy(">f4", "(1,)", &[0; 4])).is_err());
        assert!(parse_npy(&npy("<f4", "(4,)", &[0; 4])).is_err());
        assert!(parse_npy(b"junk").is_err());
    }
}
