//! Caudal benchmarks.
