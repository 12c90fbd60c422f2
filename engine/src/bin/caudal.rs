//! The `caudal` command: job manager, task manager and the client commands (see `caudal --help`).

fn main() -> std::process::ExitCode {
    caudal::logging::init();
    caudal::cluster::cli::main()
}
