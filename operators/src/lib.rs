//! Caudal operators.
