//! One run of a session on validation inputs, every output read back by name
//! ([`super::values`]): the reference's and an ONNX Runtime candidate's alike.

use std::path::Path;

use ort::session::Session;
use ort::value::DynValue;

use super::error::ValidateError;
use super::values::{self, Out};

/// Output name and value read back.
pub(crate) type Outs = Vec<(String, Out)>;

pub(super) fn bad(path: &Path, what: String) -> ValidateError {
    ValidateError::Invalid(format!("{}: {what}", path.display()))
}

/// Runs `session` on `inputs` and returns every output read back, by name.
pub(crate) fn run(
    session: &mut Session,
    inputs: &[(String, DynValue)],
    path: &Path,
) -> Result<Outs, ValidateError> {
    let feed: Vec<(&str, &DynValue)> = inputs.iter().map(|(n, v)| (n.as_str(), v)).collect();
    let names: Vec<String> = session
        .outputs()
        .iter()
        .map(|o| o.name().to_string())
        .collect();
    let out = session
        .run(feed)
        .map_err(|e| ValidateError::ort("run", path, e))?;
    let mut res = Vec::new();
    for name in names {
        let v = out
            .get(name.as_str())
            .ok_or_else(|| bad(path, format!("output `{name}` missing from the run")))?;
        let o = values::read(v).map_err(|w| bad(path, format!("output `{name}`: {w}")))?;
        res.push((name, o));
    }
    Ok(res)
}
