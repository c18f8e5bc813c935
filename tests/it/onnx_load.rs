//! Loader and `inspect` tests.
