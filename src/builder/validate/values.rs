//! Typed values for validation: every element type ONNX Runtime runs, as inputs (seeded
//! random, or from golden arrays) and as outputs read back for comparison.
//!
//! Enters: an element type and a shape (random inputs), raw little-endian bytes (golden
//! arrays), or a [`DynValue`] an ONNX Runtime run produced. Leaves: a [`DynValue`] to feed, or
//! an [`Out`]: a tensor's values as floats (compared with the tolerance) or as exact integers
//! or strings, a sequence item by item, a map key by key. Fixed-width tensors are read and
//! written through their raw bytes, so float16/bfloat16 and every integer width need no
//! extra crate.

use ort::memory::Allocator;
use ort::value::{
    DynTensor, DynTensorValueType, DynValue, DynValueTypeMarker, Sequence, Tensor,
    TensorElementType as T, TensorValueType, ValueType,
};

use crate::rng::SplitMix64;

/// A tensor's values: floats (compared with the tolerance), exact values (integers and
/// bools) or strings.
#[derive(Clone, Debug, PartialEq)]
pub enum Data {
    Float(Vec<f64>),
    Exact(Vec<i128>),
    Str(Vec<String>),
}

/// An output value read back from a run.
#[derive(Clone, Debug, PartialEq)]
pub enum Out {
    Tensor {
        ty: String,
        shape: Vec<i64>,
        data: Data,
    },
    Seq(Vec<Out>),
    /// Entries sorted by key (keys rendered exactly: integers or strings).
    Map(Vec<(String, Out)>),
}

/// f16 bits → f32.
pub fn f16_to_f32(h: u16) -> f32 {
    let sign = ((h >> 15) as u32) << 31;
    let exp = ((h >> 10) & 0x1f) as u32;
    let man = (h & 0x3ff) as u32;
    let bits = match (exp, man) {
        (0, 0) => sign,
        (0, m) => {
            // Subnormal: normalise.
            let mut e = 127 - 15 + 1;
            let mut m = m;
            while m & 0x400 == 0 {
                m <<= 1;
                e -= 1;
            }
            sign | ((e as u32) << 23) | ((m & 0x3ff) << 13)
        }
        (0x1f, m) => sign | 0x7f80_0000 | (m << 13),
        (e, m) => sign | ((e + 127 - 15) << 23) | (m << 13),
    };
    f32::from_bits(bits)
}

/// f32 → f16 bits, round to nearest even (values in validation's range; overflow → inf).
pub fn f32_to_f16(f: f32) -> u16 {
    let x = f.to_bits();
    let sign = ((x >> 16) & 0x8000) as u16;
    let exp = ((x >> 23) & 0xff) as i32;
    let man = x & 0x7f_ffff;
    if exp == 0xff {
        return sign | 0x7c00 | if man != 0 { 0x200 } else { 0 };
    }
    let e = exp - 127 + 15;
    if e >= 0x1f {
        return sign | 0x7c00;
    }
    if e <= 0 {
        if e < -10 {
            return sign;
        }
        let m = man | 0x80_0000;
        let shift = (14 - e) as u32;
        let half = 1u32 << (shift - 1);
        let mut r = m >> shift;
        let rem = m & ((1 << shift) - 1);
        if rem > half || (rem == half && r & 1 == 1) {
            r += 1;
        }
        return sign | r as u16;
    }
    let mut r = ((e as u32) << 10) | (man >> 13);
    let rem = man & 0x1fff;
    if rem > 0x1000 || (rem == 0x1000 && r & 1 == 1) {
        r += 1;
    }
    sign | r as u16
}

/// bf16 bits → f32.
pub fn bf16_to_f32(h: u16) -> f32 {
    f32::from_bits((h as u32) << 16)
}

/// f32 → bf16 bits, round to nearest even.
pub fn f32_to_bf16(f: f32) -> u16 {
    let x = f.to_bits();
    if f.is_nan() {
        return ((x >> 16) as u16) | 0x40;
    }
    let round = 0x7fff + ((x >> 16) & 1);
    (x.wrapping_add(round) >> 16) as u16
}

/// A tensor of `ty` with `shape` whose bytes are `bytes` (little-endian, C order).
pub fn tensor_from_bytes(ty: T, shape: &[i64], bytes: &[u8]) -> Result<DynValue, String> {
    let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
    let need = ty
        .byte_size(n)
        .ok_or_else(|| format!("element type {ty} has no fixed width"))?;
    if bytes.len() != need {
        return Err(format!(
            "{} bytes for {n} elements of {ty}, need {need}",
            bytes.len()
        ));
    }
    let mut t =
        DynTensor::new(&Allocator::default(), ty, shape.to_vec()).map_err(|e| e.to_string())?;
    if need > 0 {
        let p = t.data_ptr_mut().cast::<u8>();
        if p.is_null() {
            return Err("ONNX Runtime gave no buffer for the tensor".into());
        }
        // SAFETY: ORT allocated `byte_size(n)` bytes on the CPU for this tensor (the default
        // allocator), and `bytes` has exactly that length.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), p, need) };
    }
    Ok(t.into_dyn())
}

/// A string tensor.
pub fn string_tensor(shape: &[i64], data: Vec<String>) -> Result<DynValue, String> {
    Tensor::from_string_array((shape.to_vec(), data.as_slice()))
        .map(|t| t.into_dyn())
        .map_err(|e| e.to_string())
}

/// A seeded random tensor: floats uniform in [-1, 1), integers uniform in `[lo, hi)`
/// (clamped to the type), bools fair coins, strings the decimal of an integer in `[lo, hi)`.
pub fn random_tensor(
    ty: T,
    shape: &[i64],
    rng: &mut SplitMix64,
    (lo, hi): (i64, i64),
) -> Result<DynValue, String> {
    let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
    let mut b: Vec<u8> = Vec::new();
    macro_rules! ints {
        ($t:ty) => {{
            let (l, h) = (
                lo.max(<$t>::MIN as i64),
                hi.min((<$t>::MAX as i64).saturating_add(1)),
            );
            let (l, h) = if l < h { (l, h) } else { (0, 1) };
            for _ in 0..n {
                b.extend_from_slice(&(rng.int(l, h) as $t).to_le_bytes());
            }
        }};
    }
    match ty {
        T::String => {
            let (l, h) = if lo < hi { (lo, hi) } else { (0, 1) };
            return string_tensor(shape, (0..n).map(|_| rng.int(l, h).to_string()).collect());
        }
        T::Float32 => (0..n)
            .for_each(|_| b.extend_from_slice(&((rng.unit() * 2.0 - 1.0) as f32).to_le_bytes())),
        T::Float64 => {
            (0..n).for_each(|_| b.extend_from_slice(&(rng.unit() * 2.0 - 1.0).to_le_bytes()))
        }
        T::Float16 => (0..n).for_each(|_| {
            b.extend_from_slice(&f32_to_f16((rng.unit() * 2.0 - 1.0) as f32).to_le_bytes())
        }),
        T::Bfloat16 => (0..n).for_each(|_| {
            b.extend_from_slice(&f32_to_bf16((rng.unit() * 2.0 - 1.0) as f32).to_le_bytes())
        }),
        T::Bool => (0..n).for_each(|_| b.push((rng.next() & 1) as u8)),
        T::Int8 => ints!(i8),
        T::Int16 => ints!(i16),
        T::Int32 => ints!(i32),
        T::Int64 => ints!(i64),
        T::Uint8 => ints!(u8),
        T::Uint16 => ints!(u16),
        T::Uint32 => ints!(u32),
        T::Uint64 => {
            let (l, h) = (lo.max(0), hi.max(1));
            for _ in 0..n {
                b.extend_from_slice(&(rng.int(l, h) as u64).to_le_bytes());
            }
        }
        other => {
            return Err(format!(
                "element type {other} is not supported by validation"
            ))
        }
    }
    tensor_from_bytes(ty, shape, &b)
}

/// A seeded random tensor whose elements are drawn from `known` (the values the graph names
/// for the input: [`super::vocab`]); `None` when `known` does not suit `ty` (strings for a
/// string tensor; integers for an integer tensor, those that fit its type).
pub fn known_tensor(
    ty: T,
    shape: &[i64],
    rng: &mut SplitMix64,
    known: &super::vocab::Known,
) -> Option<Result<DynValue, String>> {
    use super::vocab::Known;
    let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
    match (ty, known) {
        (T::String, Known::Str(v)) if !v.is_empty() => {
            let data = (0..n)
                .map(|_| v[rng.int(0, v.len() as i64) as usize].clone())
                .collect();
            Some(string_tensor(shape, data))
        }
        (_, Known::Int(v)) => {
            let (lo, hi) = match ty {
                T::Int8 => (i8::MIN as i64, i8::MAX as i64),
                T::Int16 => (i16::MIN as i64, i16::MAX as i64),
                T::Int32 => (i32::MIN as i64, i32::MAX as i64),
                T::Int64 => (i64::MIN, i64::MAX),
                T::Uint8 => (0, u8::MAX as i64),
                T::Uint16 => (0, u16::MAX as i64),
                T::Uint32 => (0, u32::MAX as i64),
                T::Uint64 => (0, i64::MAX),
                _ => return None,
            };
            let fit: Vec<i64> = v
                .iter()
                .copied()
                .filter(|x| (lo..=hi).contains(x))
                .collect();
            if fit.is_empty() {
                return None;
            }
            let width = match ty {
                T::Int8 | T::Uint8 => 1,
                T::Int16 | T::Uint16 => 2,
                T::Int32 | T::Uint32 => 4,
                _ => 8,
            };
            let mut b = Vec::with_capacity(n * width);
            for _ in 0..n {
                let x = fit[rng.int(0, fit.len() as i64) as usize];
                // Little-endian two's complement: the low `width` bytes are the value.
                b.extend_from_slice(&x.to_le_bytes()[..width]);
            }
            Some(tensor_from_bytes(ty, shape, &b))
        }
        _ => None,
    }
}

/// A random value for a model input of type `vt` whose tensor shapes are `shape` (for a
/// sequence: the shape of each of its two items; an optional input gets its contained
/// value).
pub fn random_value(
    vt: &ValueType,
    shape: &[i64],
    rng: &mut SplitMix64,
    int_range: (i64, i64),
) -> Result<DynValue, String> {
    match vt {
        ValueType::Tensor { ty, .. } => random_tensor(*ty, shape, rng, int_range),
        ValueType::Optional(inner) => random_value(inner, shape, rng, int_range),
        ValueType::Sequence(inner) => match inner.as_ref() {
            ValueType::Tensor { ty, .. } => {
                let items = (0..2)
                    .map(|_| {
                        random_tensor(*ty, shape, rng, int_range)?
                            .downcast::<DynTensorValueType>()
                            .map_err(|e| e.to_string())
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                Sequence::new(items)
                    .map(|s| s.into_dyn())
                    .map_err(|e| e.to_string())
            }
            other => Err(format!(
                "inputs of type seq({other}) are not supported by validation; give golden inputs"
            )),
        },
        ValueType::Map { key, value } => random_map(*key, *value, None, rng, int_range),
    }
}

/// A seeded random map for a `map(key, value)` input: the keys `known` names (the graph's:
/// a DictVectorizer's vocabulary, [`super::vocab`]) when they suit `key`, else two
/// (`"0"`, `"1"` or 0, 1); values as [`random_tensor`] makes them.
pub fn random_map(
    key: T,
    value: T,
    known: Option<&super::vocab::Known>,
    rng: &mut SplitMix64,
    int_range: (i64, i64),
) -> Result<DynValue, String> {
    use super::vocab::Known;
    use ort::value::Map;
    let e = |e: ort::Error| e.to_string();
    let n = match known {
        Some(Known::Str(v)) if key == T::String => v.len(),
        Some(Known::Int(v)) if key == T::Int64 => v.len(),
        _ => 2,
    };
    let vals = random_tensor(value, &[n as i64], rng, int_range)?;
    macro_rules! keyed {
        ($keys:expr) => {
            match value {
                T::Float32 => {
                    Map::new_kv($keys, vals.downcast::<TensorValueType<f32>>().map_err(e)?)
                        .map(|m| m.into_dyn())
                }
                T::Float64 => {
                    Map::new_kv($keys, vals.downcast::<TensorValueType<f64>>().map_err(e)?)
                        .map(|m| m.into_dyn())
                }
                T::Int64 => Map::new_kv($keys, vals.downcast::<TensorValueType<i64>>().map_err(e)?)
                    .map(|m| m.into_dyn()),
                T::String => Map::new_kv(
                    $keys,
                    vals.downcast::<TensorValueType<String>>().map_err(e)?,
                )
                .map(|m| m.into_dyn()),
                other => {
                    return Err(format!(
                        "map inputs with {} values are not supported by validation",
                        ty_name(other)
                    ))
                }
            }
            .map_err(e)
        };
    }
    match key {
        T::String => {
            let keys: Vec<String> = match known {
                Some(Known::Str(v)) => v.clone(),
                _ => vec!["0".into(), "1".into()],
            };
            keyed!(Tensor::from_string_array((vec![n], keys.as_slice())).map_err(e)?)
        }
        T::Int64 => {
            let keys: Vec<i64> = match known {
                Some(Known::Int(v)) => v.clone(),
                _ => vec![0, 1],
            };
            keyed!(Tensor::from_array((vec![n], keys)).map_err(e)?)
        }
        other => Err(format!(
            "map inputs with {} keys are not supported by validation",
            ty_name(other)
        )),
    }
}

fn exact_of(bytes: &[u8], ty: T) -> Option<Vec<i128>> {
    macro_rules! le {
        ($t:ty) => {
            bytes
                .chunks_exact(std::mem::size_of::<$t>())
                .map(|c| <$t>::from_le_bytes(c.try_into().expect("chunk width")) as i128)
                .collect()
        };
    }
    Some(match ty {
        T::Bool => bytes.iter().map(|&x| (x != 0) as i128).collect(),
        T::Int8 => le!(i8),
        T::Int16 => le!(i16),
        T::Int32 => le!(i32),
        T::Int64 => le!(i64),
        T::Uint8 => le!(u8),
        T::Uint16 => le!(u16),
        T::Uint32 => le!(u32),
        T::Uint64 => le!(u64),
        _ => return None,
    })
}

fn float_of(bytes: &[u8], ty: T) -> Option<Vec<f64>> {
    let w = |n: usize| bytes.chunks_exact(n);
    Some(match ty {
        T::Float32 => w(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")) as f64)
            .collect(),
        T::Float64 => w(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
            .collect(),
        T::Float16 => w(2)
            .map(|c| f16_to_f32(u16::from_le_bytes(c.try_into().expect("2"))) as f64)
            .collect(),
        T::Bfloat16 => w(2)
            .map(|c| bf16_to_f32(u16::from_le_bytes(c.try_into().expect("2"))) as f64)
            .collect(),
        // Complex: real and imaginary parts in turn.
        T::Complex64 => w(4)
            .map(|c| f32::from_le_bytes(c.try_into().expect("4")) as f64)
            .collect(),
        T::Complex128 => w(8)
            .map(|c| f64::from_le_bytes(c.try_into().expect("8")))
            .collect(),
        _ => return None,
    })
}

fn ty_name(ty: T) -> String {
    crate::onnx::ElemType::from_code(elem_code(ty))
        .name()
        .into_owned()
}

/// `TensorProto.DataType` code of an ort element type.
pub fn elem_code(ty: T) -> i32 {
    match ty {
        T::Float32 => 1,
        T::Uint8 => 2,
        T::Int8 => 3,
        T::Uint16 => 4,
        T::Int16 => 5,
        T::Int32 => 6,
        T::Int64 => 7,
        T::String => 8,
        T::Bool => 9,
        T::Float16 => 10,
        T::Float64 => 11,
        T::Uint32 => 12,
        T::Uint64 => 13,
        T::Complex64 => 14,
        T::Complex128 => 15,
        T::Bfloat16 => 16,
        T::Float8E4M3FN => 17,
        T::Float8E4M3FNUZ => 18,
        T::Float8E5M2 => 19,
        T::Float8E5M2FNUZ => 20,
        T::Uint4 => 21,
        T::Int4 => 22,
        T::Float4E2M1 => 23,
        T::Float8E8M0 => 24,
        T::Uint2 => 25,
        T::Int2 => 26,
        _ => 0,
    }
}

/// A fixed-width tensor's element type, shape and bytes (native order, C layout).
pub fn tensor_bytes(v: &DynValue) -> Result<(T, Vec<i64>, Vec<u8>), String> {
    let ValueType::Tensor { ty, shape, .. } = v.dtype() else {
        return Err(format!("{} is not a tensor", v.dtype()));
    };
    let ty = *ty;
    let shape = shape.to_vec();
    let n: usize = shape.iter().map(|&d| d.max(0) as usize).product();
    let width = ty
        .byte_size(n)
        .ok_or_else(|| format!("element type {ty} has no fixed width"))?;
    let t = v.view();
    let t = t
        .downcast::<DynTensorValueType>()
        .map_err(|e| e.to_string())?;
    if width == 0 {
        return Ok((ty, shape, Vec::new()));
    }
    let p = t.data_ptr().cast::<u8>();
    if p.is_null() {
        return Err("the tensor has no data".into());
    }
    // SAFETY: a CPU tensor of `n` elements of `ty` owns `byte_size(n)` bytes.
    let bytes = unsafe { std::slice::from_raw_parts(p, width) }.to_vec();
    Ok((ty, shape, bytes))
}

/// An output read from a fixed-width tensor's bytes (what a TensorRT engine run returns).
pub fn out_of_bytes(ty: T, shape: Vec<i64>, bytes: &[u8]) -> Result<Out, String> {
    let data = if let Some(f) = float_of(bytes, ty) {
        Data::Float(f)
    } else if let Some(x) = exact_of(bytes, ty) {
        Data::Exact(x)
    } else {
        return Err(format!("element type {ty} is not supported by validation"));
    };
    Ok(Out::Tensor {
        ty: ty_name(ty),
        shape,
        data,
    })
}

/// Reads a run's output back.
pub fn read(v: &DynValue) -> Result<Out, String> {
    let e = |e: ort::Error| e.to_string();
    match v.dtype() {
        ValueType::Tensor { ty: T::String, .. } => {
            let (shape, data) = v.try_extract_strings().map_err(e)?;
            Ok(Out::Tensor {
                ty: "string".into(),
                shape: shape.to_vec(),
                data: Data::Str(data),
            })
        }
        ValueType::Tensor { .. } => {
            let (ty, shape, bytes) = tensor_bytes(v)?;
            out_of_bytes(ty, shape, &bytes)
        }
        ValueType::Sequence(_) => {
            let items = v.try_extract_sequence::<DynValueTypeMarker>().map_err(e)?;
            Ok(Out::Seq(items.iter().map(read).collect::<Result<_, _>>()?))
        }
        ValueType::Map { key, value } => {
            macro_rules! kv {
                ($k:ty, $v:ty, $wrap:expr) => {{
                    let mut kv: Vec<(String, Out)> = v
                        .try_extract_key_values::<$k, $v>()
                        .map_err(e)?
                        .into_iter()
                        .map(|(k, x)| (format!("{k:?}"), $wrap(x)))
                        .collect();
                    kv.sort_by(|a, b| a.0.cmp(&b.0));
                    Ok(Out::Map(kv))
                }};
            }
            let f = |x: f64| Out::Tensor {
                ty: "float".into(),
                shape: vec![],
                data: Data::Float(vec![x]),
            };
            let i = |x: i64| Out::Tensor {
                ty: "int64".into(),
                shape: vec![],
                data: Data::Exact(vec![x as i128]),
            };
            match (key, value) {
                (T::Int64, T::Float32) => kv!(i64, f32, |x: f32| f(x as f64)),
                (T::Int64, T::Float64) => kv!(i64, f64, f),
                (T::Int64, T::Int64) => kv!(i64, i64, i),
                (T::String, T::Float32) => kv!(String, f32, |x: f32| f(x as f64)),
                (T::String, T::Float64) => kv!(String, f64, f),
                (T::String, T::Int64) => kv!(String, i64, i),
                (k, v) => Err(format!(
                    "map({k}, {v}) outputs are not supported by validation"
                )),
            }
        }
        ValueType::Optional(_) => Err("optional outputs are not supported by validation".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn half_conversions_round_trip() {
        for v in [
            0.0f32, -0.0, 1.0, -2.5, 0.1, 65504.0, 6.1e-5, 5.96e-8, -0.333,
        ] {
            let h = f32_to_f16(v);
            let back = f16_to_f32(h);
            assert!(
                (back - v).abs() <= v.abs() * 1e-3 + 6e-8,
                "{v} -> {h:#x} -> {back}"
            );
            assert_eq!(f32_to_f16(back), h);
        }
        assert_eq!(f32_to_f16(1.0), 0x3c00);
        assert_eq!(f32_to_f16(f32::INFINITY), 0x7c00);
        assert!(f16_to_f32(f32_to_f16(f32::NAN)).is_nan());
        assert_eq!(f32_to_bf16(1.0), 0x3f80);
        assert_eq!(bf16_to_f32(0x3f80), 1.0);
        assert!((bf16_to_f32(f32_to_bf16(0.1)) - 0.1).abs() < 1e-3);
    }
}
