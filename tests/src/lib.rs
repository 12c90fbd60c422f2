//! Caudal end-to-end tests.
