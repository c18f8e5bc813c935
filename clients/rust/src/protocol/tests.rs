//! Round trips of the wire types, and which versions a [`Runtime`] matches.

use super::*;

mod roundtrip {
    use super::*;

    #[test]
    fn requests_round_trip_with_op_tag() {
        let r = Request::Acquire(AcquireRequest {
            model: "m".into(),
            wait: true,
            ..Default::default()
        });
        let j = serde_json::to_string(&r).unwrap();
        assert!(j.contains("\"op\":\"acquire\""), "{j}");
        assert_eq!(serde_json::from_str::<Request>(&j).unwrap(), r);
        let minimal: Request = serde_json::from_str(r#"{"op":"acquire","model":"m"}"#).unwrap();
        assert_eq!(minimal, r, "wait defaults to true");
        let Request::Acquire(defaulted) = minimal else {
            unreachable!()
        };
        assert_eq!(
            defaulted,
            AcquireRequest {
                model: "m".into(),
                ..Default::default()
            },
            "AcquireRequest::default() is the wire's default"
        );
        assert!(AcquireRequest::default().wait);
    }

    #[test]
    fn error_codes_are_snake_case_on_the_wire() {
        let e = Response::Error(ErrorBody {
            code: ErrorCode::BadName,
            message: "x".into(),
        });
        let j = serde_json::to_string(&e).unwrap();
        assert!(j.contains("\"code\":\"bad_name\""), "{j}");
        assert_eq!(ErrorCode::FrameTooLarge.as_str(), "frame_too_large");
        for c in ErrorCode::ALL {
            let wire = serde_json::to_string(c).unwrap();
            assert_eq!(wire, format!("\"{}\"", c.as_str()));
        }
        let mut names: Vec<_> = ErrorCode::ALL.iter().map(|c| c.as_str()).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), ErrorCode::ALL.len());
    }

    #[test]
    fn watch_frames_round_trip() {
        let r: Request = serde_json::from_str(r#"{"op":"watch","model":"m"}"#).unwrap();
        assert_eq!(r, Request::Watch { model: "m".into() });
        assert!(REQUEST_OPS.contains(&"watch"));
        let ev = Response::WatchEvent(WatchEvent {
            model: "m".into(),
            reason: WatchReason::Ready,
            version: Some(2),
            profile: Some("default".into()),
            backend: Some("ort-cpu".into()),
            key: Some("ab".repeat(32)),
            origin: Some(Origin::Built),
            message: None,
        });
        let j = serde_json::to_string(&ev).unwrap();
        assert!(
            j.contains(r#""kind":"watch_event""#) && j.contains(r#""reason":"ready""#),
            "{j}"
        );
        assert_eq!(serde_json::from_str::<Response>(&j).unwrap(), ev);
        // A model-wide event from a peer that leaves the optional fields out.
        let bare: Response =
            serde_json::from_str(r#"{"kind":"watch_event","model":"m","reason":"resync"}"#)
                .unwrap();
        let Response::WatchEvent(e) = bare else {
            unreachable!()
        };
        assert_eq!(
            (e.reason, e.key, e.profile),
            (WatchReason::Resync, None, None)
        );
        assert_eq!(WatchReason::Evicted.to_string(), "evicted");
    }

    #[test]
    fn names_that_are_paths_are_invalid() {
        for bad in [
            "",
            "..",
            "../x",
            "/etc/passwd",
            "a/b",
            ".hidden",
            "a\\b",
            "a\nb",
        ] {
            assert!(!valid_model_name(bad), "{bad:?}");
        }
        for good in ["resnet50", "tiny_encoder", "bert-base.v2"] {
            assert!(valid_model_name(good), "{good:?}");
        }
    }
}

mod runtime {
    use super::*;
    use std::collections::BTreeMap;

    #[test]
    fn a_runtime_matches_only_artifacts_built_with_its_versions() {
        let built = |v: &str| BTreeMap::from([("onnxruntime".to_string(), v.to_string())]);
        let rt = Runtime::onnxruntime("1.31.1");
        assert!(rt.matches(&built("1.31.1")));
        assert!(!rt.matches(&built("1.30.0")));
        assert!(
            !rt.matches(&BTreeMap::from([
                ("onnxruntime".to_string(), "1.30.0".to_string()),
                ("tensorrt".to_string(), "10.16.0".to_string())
            ])),
            "an ort-tensorrt artifact of another onnxruntime"
        );
        assert!(
            Runtime::default().matches(&built("1.30.0")),
            "names nothing"
        );
        let trt = Runtime {
            tensorrt: Some("10.16.0".into()),
            ..Runtime::onnxruntime("1.31.1")
        };
        // An ort-cpu artifact records no TensorRT: a consumer's TensorRT does not matter to
        // it; a trt engine records no ONNX Runtime.
        let mut v = built("1.31.1");
        assert!(trt.matches(&v));
        v.insert("tensorrt".into(), "10.16.0".into());
        assert!(trt.matches(&v));
        v.insert("tensorrt".into(), "10.17.0".into());
        assert!(!trt.matches(&v));
        let engine = BTreeMap::from([("tensorrt".to_string(), "10.16.0".to_string())]);
        assert!(trt.matches(&engine));
        assert_eq!(trt.describe(), "onnxruntime 1.31.1, tensorrt 10.16.0");
    }

    #[test]
    fn an_acquire_without_a_runtime_is_the_old_wire_format() {
        let req = AcquireRequest {
            model: "m".into(),
            ..Default::default()
        };
        let json = serde_json::to_string(&req).unwrap();
        assert!(!json.contains("runtime"), "{json}");
        let back: AcquireRequest =
            serde_json::from_str(r#"{"model":"m","runtime":{"onnxruntime":"1.30.0"}}"#).unwrap();
        assert_eq!(back.runtime, Some(Runtime::onnxruntime("1.30.0")));
    }
}
