//! Caudal engine.
