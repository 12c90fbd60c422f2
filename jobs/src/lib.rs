//! Caudal jobs.
