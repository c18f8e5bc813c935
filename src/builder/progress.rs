//! What a build reports between its steps ([`Progress`]): the CLI prints each as a line
//! (its [`Display`](std::fmt::Display) is the text), the daemon maps them to the build
//! phases a client sees, and the worker process sends them to its parent as JSON.

use serde::{Deserialize, Serialize};

use super::OptLevel;
use crate::spec::Backend;

/// A step of a build.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Progress {
    /// Keying the model (its digest).
    Hashing,
    /// The backend's build begins.
    Building(Backend),
    /// Validation against the original model begins.
    Validating,
    /// The default input search runs the original model on the candidate of this label
    /// (`realistic batch=2 …`): a worker that dies before [`Progress::InputsFound`]
    /// died in the reference run on those inputs, and the pipeline validates again
    /// without them ([`Fallback::ReferenceCrashed`]). Not printed by the CLI.
    TryingInputs(String),
    /// The input search ended (inputs found, or the search refused).
    InputsFound,
    /// A failed attempt is built again, as the backend's fallback ladder says.
    Retrying(Fallback),
    /// The record (and the artifact, when it passed) goes into the store.
    Storing,
}

/// What the next attempt gives up, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Fallback {
    /// The build worker died of a fault: built again without `without` (prepack, the
    /// probes, the rewrites).
    WorkerDied { without: String },
    /// A rewritten artifact over tolerance: built again without the graph passes.
    WithoutRewrites,
    /// An artifact over tolerance at `from`: built again at `to`.
    LowerLevel { from: OptLevel, to: OptLevel },
    /// ONNX Runtime crashed running the original model on the default validation inputs
    /// `inputs` (a fault in the runtime at those sizes, not the artifact's): validated
    /// again on the next candidate sizes.
    ReferenceCrashed { inputs: String },
}

impl Fallback {
    /// Whether the attempt failed validation (it was built, and over tolerance), not the
    /// worker.
    pub fn over_tolerance(&self) -> bool {
        !matches!(
            self,
            Fallback::WorkerDied { .. } | Fallback::ReferenceCrashed { .. }
        )
    }
}

impl std::fmt::Display for Progress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Progress::Hashing => f.write_str("hashing model"),
            Progress::Building(b) => write!(f, "building with {b}"),
            Progress::Validating => {
                f.write_str("validating against the original model (ORT CPU, optimizations off)")
            }
            Progress::Retrying(Fallback::WorkerDied { without }) => {
                write!(f, "the build worker died: building without {without}")
            }
            Progress::Retrying(Fallback::WithoutRewrites) => {
                f.write_str("over tolerance with graph rewrites: building without them")
            }
            Progress::Retrying(Fallback::LowerLevel { from, to }) => write!(
                f,
                "over tolerance at optimization level {}: building at {}",
                from.name(),
                to.name()
            ),
            Progress::TryingInputs(label) => {
                write!(f, "running the original model at {label}")
            }
            Progress::InputsFound => f.write_str("validation inputs found"),
            Progress::Retrying(Fallback::ReferenceCrashed { inputs }) => write!(
                f,
                "ONNX Runtime crashed running the original model at {inputs}: validating at other sizes"
            ),
            Progress::Storing => f.write_str("storing"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The CLI prints these lines; they read as they did when they were strings.
    #[test]
    fn the_lines_read_as_before() {
        let lines: Vec<String> = [
            Progress::Hashing,
            Progress::Building(Backend::OrtCpu),
            Progress::Validating,
            Progress::Retrying(Fallback::WorkerDied {
                without: "prepack".into(),
            }),
            Progress::Retrying(Fallback::WithoutRewrites),
            Progress::Retrying(Fallback::LowerLevel {
                from: OptLevel::All,
                to: OptLevel::Extended,
            }),
            Progress::Storing,
        ]
        .iter()
        .map(|p| p.to_string())
        .collect();
        assert_eq!(
            lines,
            [
                "hashing model",
                "building with ort-cpu",
                "validating against the original model (ORT CPU, optimizations off)",
                "the build worker died: building without prepack",
                "over tolerance with graph rewrites: building without them",
                "over tolerance at optimization level all: building at extended",
                "storing",
            ]
        );
        let p = Progress::Retrying(Fallback::LowerLevel {
            from: OptLevel::All,
            to: OptLevel::Basic,
        });
        let back: Progress = serde_json::from_str(&serde_json::to_string(&p).unwrap()).unwrap();
        assert_eq!(back, p);
    }
}
