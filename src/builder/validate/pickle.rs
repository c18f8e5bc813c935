//! Object arrays of strings in `.npy` files: numpy pickles them (`pickle.dump(array)`), so
//! reading one means reading a pickle. This is a data-only reader for the opcodes numpy's
//! pickles use: nothing is imported or called, `GLOBAL`/`REDUCE`/`BUILD` just build inert
//! values, and the strings are taken from the list in the array's `__setstate__` tuple.
//!
//! Enters: the bytes after the `.npy` header and the element count. Leaves: the strings, or
//! a message saying what the pickle holds instead.

#[derive(Clone, Debug)]
enum V {
    None,
    Bool,
    Int,
    Float,
    Str(String),
    Bytes,
    Tuple(Vec<V>),
    List(Vec<V>),
    Dict,
    Global,
    /// A callable applied to arguments, with the state `BUILD` gave it.
    Obj(Option<Box<V>>),
    Mark,
}

/// Stack depth and memo size bound the work a hostile pickle can ask for.
const MAX_ITEMS: usize = 1 << 24;

/// The strings of a pickled numpy object array of `n` elements.
pub fn object_strings(b: &[u8], n: usize) -> Result<Vec<String>, String> {
    let top = run(b)?;
    let V::Obj(Some(state)) = top else {
        return Err("object array: the pickle is not a numpy array".into());
    };
    let V::Tuple(items) = *state else {
        return Err("object array: unexpected array state".into());
    };
    let Some(V::List(values)) = items.last() else {
        return Err("object array: the array's values are not a list".into());
    };
    if values.len() != n {
        return Err(format!(
            "object array: {} values for a shape of {n} elements",
            values.len()
        ));
    }
    values
        .iter()
        .map(|v| match v {
            V::Str(s) => Ok(s.clone()),
            other => Err(format!(
                "object array holds {} values; only strings map to an ONNX type",
                kind(other)
            )),
        })
        .collect()
}

fn kind(v: &V) -> &'static str {
    match v {
        V::None => "None",
        V::Bool => "bool",
        V::Int => "int",
        V::Float => "float",
        V::Str(_) => "str",
        V::Bytes => "bytes",
        V::Tuple(_) => "tuple",
        V::List(_) => "list",
        V::Dict => "dict",
        V::Global | V::Obj(_) => "object",
        V::Mark => "mark",
    }
}

/// Runs the pickle machine over `b` to its STOP: the value it leaves.
///
/// One piece: the machine's dispatch, one short arm per opcode over one stack, memo and
/// cursor; split, the arms would pass those three around and read no clearer.
fn run(b: &[u8]) -> Result<V, String> {
    let mut st: Vec<V> = Vec::new();
    let mut memo: Vec<Option<V>> = Vec::new();
    let mut i = 0usize;
    let trunc = || "object array: truncated pickle".to_string();
    let take = |i: &mut usize, n: usize| -> Result<&[u8], String> {
        let s = b
            .get(*i..i.checked_add(n).ok_or_else(trunc)?)
            .ok_or_else(trunc)?;
        *i += n;
        Ok(s)
    };
    let u32le = |s: &[u8]| u32::from_le_bytes(s.try_into().expect("4")) as usize;
    fn pop_mark(st: &mut Vec<V>) -> Result<Vec<V>, String> {
        let at = st
            .iter()
            .rposition(|v| matches!(v, V::Mark))
            .ok_or("object array: pickle has no mark")?;
        let items = st.split_off(at + 1);
        st.pop();
        Ok(items)
    }
    fn pop(st: &mut Vec<V>) -> Result<V, String> {
        st.pop()
            .ok_or_else(|| "object array: pickle stack underflow".into())
    }
    fn memo_put(memo: &mut Vec<Option<V>>, at: usize, v: V) -> Result<(), String> {
        if at >= MAX_ITEMS {
            return Err("object array: pickle memo too large".into());
        }
        if memo.len() <= at {
            memo.resize(at + 1, None);
        }
        memo[at] = Some(v);
        Ok(())
    }
    loop {
        if st.len() > MAX_ITEMS {
            return Err("object array: pickle too large".into());
        }
        let op = *b.get(i).ok_or_else(trunc)?;
        i += 1;
        match op {
            0x80 => i += 1,              // PROTO
            0x95 => i += 8,              // FRAME
            b'.' => return pop(&mut st), // STOP
            b'(' => st.push(V::Mark),
            b'N' => st.push(V::None),
            0x88 | 0x89 => st.push(V::Bool),
            b'K' => {
                take(&mut i, 1)?;
                st.push(V::Int)
            }
            b'M' => {
                take(&mut i, 2)?;
                st.push(V::Int)
            }
            b'J' => {
                take(&mut i, 4)?;
                st.push(V::Int)
            }
            0x8a => {
                let n = take(&mut i, 1)?[0] as usize;
                take(&mut i, n)?;
                st.push(V::Int)
            }
            b'G' => {
                take(&mut i, 8)?;
                st.push(V::Float)
            }
            0x8c | b'X' | 0x8d => {
                let n = match op {
                    0x8c => take(&mut i, 1)?[0] as usize,
                    b'X' => u32le(take(&mut i, 4)?),
                    _ => u64::from_le_bytes(take(&mut i, 8)?.try_into().expect("8")) as usize,
                };
                let s = std::str::from_utf8(take(&mut i, n)?)
                    .map_err(|_| "object array: a string is not UTF-8")?;
                st.push(V::Str(s.to_string()))
            }
            b'C' | b'B' => {
                let n = if op == b'C' {
                    take(&mut i, 1)?[0] as usize
                } else {
                    u32le(take(&mut i, 4)?)
                };
                take(&mut i, n)?;
                st.push(V::Bytes)
            }
            b'c' => {
                // GLOBAL: two newline-terminated names.
                for _ in 0..2 {
                    let end = b[i..].iter().position(|&x| x == b'\n').ok_or_else(trunc)?;
                    i += end + 1;
                }
                st.push(V::Global)
            }
            0x93 => {
                pop(&mut st)?;
                pop(&mut st)?;
                st.push(V::Global)
            }
            b')' => st.push(V::Tuple(Vec::new())),
            b't' => {
                let items = pop_mark(&mut st)?;
                st.push(V::Tuple(items))
            }
            0x85..=0x87 => {
                let n = (op - 0x84) as usize;
                if st.len() < n {
                    return Err("object array: pickle stack underflow".into());
                }
                let items = st.split_off(st.len() - n);
                st.push(V::Tuple(items))
            }
            b']' => st.push(V::List(Vec::new())),
            b'l' => {
                let items = pop_mark(&mut st)?;
                st.push(V::List(items))
            }
            b'a' => {
                let v = pop(&mut st)?;
                match st.last_mut() {
                    Some(V::List(l)) => l.push(v),
                    _ => return Err("object array: APPEND to a non-list".into()),
                }
            }
            b'e' => {
                let items = pop_mark(&mut st)?;
                match st.last_mut() {
                    Some(V::List(l)) => l.extend(items),
                    _ => return Err("object array: APPENDS to a non-list".into()),
                }
            }
            b'}' => st.push(V::Dict),
            b's' => {
                pop(&mut st)?;
                pop(&mut st)?;
            }
            b'u' => {
                pop_mark(&mut st)?;
            }
            b'R' | 0x81 => {
                // REDUCE / NEWOBJ: callable and arguments become an inert object.
                pop(&mut st)?;
                pop(&mut st)?;
                st.push(V::Obj(None))
            }
            b'b' => {
                let state = pop(&mut st)?;
                match st.last_mut() {
                    Some(V::Obj(s)) => *s = Some(Box::new(state)),
                    _ => return Err("object array: BUILD on a non-object".into()),
                }
            }
            b'q' => {
                let at = take(&mut i, 1)?[0] as usize;
                let v = st.last().cloned().ok_or("object array: empty stack")?;
                memo_put(&mut memo, at, v)?;
            }
            b'r' => {
                let at = u32le(take(&mut i, 4)?);
                let v = st.last().cloned().ok_or("object array: empty stack")?;
                memo_put(&mut memo, at, v)?;
            }
            0x94 => {
                let at = memo.len();
                let v = st.last().cloned().ok_or("object array: empty stack")?;
                memo_put(&mut memo, at, v)?;
            }
            b'h' | b'j' => {
                let at = if op == b'h' {
                    take(&mut i, 1)?[0] as usize
                } else {
                    u32le(take(&mut i, 4)?)
                };
                let v = memo
                    .get(at)
                    .cloned()
                    .flatten()
                    .ok_or("object array: pickle refers to a missing memo entry")?;
                st.push(v)
            }
            other => {
                return Err(format!(
                    "object array: pickle opcode {other:#04x} is not supported"
                ))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_garbage_without_panicking() {
        assert!(object_strings(b"", 1).is_err());
        assert!(object_strings(b"\x80\x03K", 1).is_err());
        assert!(object_strings(b"\x80\x03N.", 1).is_err());
        assert!(object_strings(&[b'h', 9, b'.'], 1).is_err());
        assert!(object_strings(b"(((((((((((((((((((((((((((((", 1).is_err());
    }
}
