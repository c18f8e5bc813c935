//! ONNX element types (`TensorProto.DataType`): names as `inspect` prints them and sizes.

use serde::{Serialize, Serializer};

/// An ONNX tensor element type. Unknown codes are kept as `Other(code)`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ElemType {
    Undefined,
    Float32,
    Uint8,
    Int8,
    Uint16,
    Int16,
    Int32,
    Int64,
    String,
    Bool,
    Float16,
    Float64,
    Uint32,
    Uint64,
    Complex64,
    Complex128,
    Bfloat16,
    Float8e4m3fn,
    Float8e4m3fnuz,
    Float8e5m2,
    Float8e5m2fnuz,
    Uint4,
    Int4,
    Float4e2m1,
    Float8e8m0,
    Uint2,
    Int2,
    Other(i32),
}

impl ElemType {
    /// Maps a `TensorProto.DataType` code.
    pub fn from_code(code: i32) -> Self {
        use ElemType::*;
        match code {
            0 => Undefined,
            1 => Float32,
            2 => Uint8,
            3 => Int8,
            4 => Uint16,
            5 => Int16,
            6 => Int32,
            7 => Int64,
            8 => String,
            9 => Bool,
            10 => Float16,
            11 => Float64,
            12 => Uint32,
            13 => Uint64,
            14 => Complex64,
            15 => Complex128,
            16 => Bfloat16,
            17 => Float8e4m3fn,
            18 => Float8e4m3fnuz,
            19 => Float8e5m2,
            20 => Float8e5m2fnuz,
            21 => Uint4,
            22 => Int4,
            23 => Float4e2m1,
            24 => Float8e8m0,
            25 => Uint2,
            26 => Int2,
            other => Other(other),
        }
    }

    /// The `TensorProto.DataType` code.
    pub fn code(self) -> i32 {
        use ElemType::*;
        match self {
            Undefined => 0,
            Float32 => 1,
            Uint8 => 2,
            Int8 => 3,
            Uint16 => 4,
            Int16 => 5,
            Int32 => 6,
            Int64 => 7,
            String => 8,
            Bool => 9,
            Float16 => 10,
            Float64 => 11,
            Uint32 => 12,
            Uint64 => 13,
            Complex64 => 14,
            Complex128 => 15,
            Bfloat16 => 16,
            Float8e4m3fn => 17,
            Float8e4m3fnuz => 18,
            Float8e5m2 => 19,
            Float8e5m2fnuz => 20,
            Uint4 => 21,
            Int4 => 22,
            Float4e2m1 => 23,
            Float8e8m0 => 24,
            Uint2 => 25,
            Int2 => 26,
            Other(c) => c,
        }
    }

    /// Lower-case name: `float32`, `float16`, `int64`, `bool`, …
    pub fn name(self) -> std::borrow::Cow<'static, str> {
        use ElemType::*;
        let s = match self {
            Undefined => "undefined",
            Float32 => "float32",
            Uint8 => "uint8",
            Int8 => "int8",
            Uint16 => "uint16",
            Int16 => "int16",
            Int32 => "int32",
            Int64 => "int64",
            String => "string",
            Bool => "bool",
            Float16 => "float16",
            Float64 => "float64",
            Uint32 => "uint32",
            Uint64 => "uint64",
            Complex64 => "complex64",
            Complex128 => "complex128",
            Bfloat16 => "bfloat16",
            Float8e4m3fn => "float8e4m3fn",
            Float8e4m3fnuz => "float8e4m3fnuz",
            Float8e5m2 => "float8e5m2",
            Float8e5m2fnuz => "float8e5m2fnuz",
            Uint4 => "uint4",
            Int4 => "int4",
            Float4e2m1 => "float4e2m1",
            Float8e8m0 => "float8e8m0",
            Uint2 => "uint2",
            Int2 => "int2",
            Other(c) => return format!("type{c}").into(),
        };
        s.into()
    }

    /// Storage bits per element, `None` for strings and unknown types.
    pub fn bits(self) -> Option<u64> {
        use ElemType::*;
        Some(match self {
            Bool | Uint8 | Int8 => 8,
            Float8e4m3fn | Float8e4m3fnuz | Float8e5m2 | Float8e5m2fnuz | Float8e8m0 => 8,
            Uint16 | Int16 | Float16 | Bfloat16 => 16,
            Float32 | Int32 | Uint32 => 32,
            Float64 | Int64 | Uint64 | Complex64 => 64,
            Complex128 => 128,
            Uint4 | Int4 | Float4e2m1 => 4,
            Uint2 | Int2 => 2,
            Undefined | String | Other(_) => return None,
        })
    }

    /// Bytes taken by `numel` packed elements of this type, `None` when unknown.
    pub fn bytes_for(self, numel: u64) -> Option<u64> {
        let bits = self.bits()?;
        numel.checked_mul(bits).map(|b| b.div_ceil(8))
    }

    /// Whether the type is a floating-point type of any width.
    pub fn is_float(self) -> bool {
        use ElemType::*;
        matches!(
            self,
            Float32
                | Float16
                | Float64
                | Bfloat16
                | Float8e4m3fn
                | Float8e4m3fnuz
                | Float8e5m2
                | Float8e5m2fnuz
                | Float4e2m1
                | Float8e8m0
        )
    }
}

impl std::fmt::Display for ElemType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name())
    }
}

impl Serialize for ElemType {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_round_trip() {
        for code in 0..30 {
            assert_eq!(ElemType::from_code(code).code(), code);
        }
        assert_eq!(ElemType::from_code(1).name(), "float32");
        assert_eq!(ElemType::from_code(99).name(), "type99");
        assert_eq!(ElemType::Int4.bytes_for(3), Some(2));
        assert_eq!(ElemType::String.bytes_for(3), None);
    }
}
