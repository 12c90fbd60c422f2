//! Embedded mode: the whole job in this process, with its own checkpoint coordinator,
//! signal handling (Ctrl-C, SIGTERM: a clean stop), REST API and web UI, progress line and
//! the savepoint of a stop.

use super::{JobParts, JobResult, ProgressTicker, Run, StopRule};
use crate::job::{JobStatus, JobView, StopHandle};
use crate::{Error, Result};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

/// Runs the job until its bounded input ends, it is stopped, or a task fails.
pub(crate) fn execute(parts: JobParts, job_name: &str) -> Result<JobResult> {
    let config = &parts.config;
    let queries = Arc::new(crate::state_query::StateQueries::new());
    let mut run = Run::prepare(&parts, config, job_name, None, queries.clone(), None)?;
    if let (Some(name), Some((_, paths))) = (&config.checkpoints.savepoint_on_stop, &run.storage) {
        paths.savepoint_dir(name).map_err(|e| Error::config("savepoint_on_stop", e.to_string()))?;
    }
    let control = &parts.control;
    let stop_requested = control.stop_requested.clone();
    if config.handle_signals {
        for sig in [signal_hook::consts::SIGINT, signal_hook::consts::SIGTERM] {
            // A second signal exits at once; the first asks for a clean stop.
            signal_hook::flag::register_conditional_shutdown(sig, 130, stop_requested.clone())
                .map_err(|e| Error::io("installing the signal handler", e))?;
            signal_hook::flag::register(sig, stop_requested.clone())
                .map_err(|e| Error::io("installing the signal handler", e))?;
        }
    }
    let stop = StopHandle::from_flag(stop_requested.clone());
    let mut view = JobView::new(job_name, run.plan.clone(), parts.metrics.clone(), stop.clone(), stop);
    view.state_queries = queries;
    let view = Arc::new(view);
    view.set_status(JobStatus::Running);
    let (ack_tx, ack_rx) = crossbeam_channel::unbounded();
    let mut coordinator = run.coordinator(config, ack_rx, view.clone())?;
    // The REST API and web UI, for as long as this call runs (dropped on return); after
    // the coordinator, so that a savepoint can be asked for from the first request on.
    let _web = match config.web_bind {
        Some(addr) => {
            let server = crate::web::WebServer::start_for_job(addr, view.clone(), config);
            Some(server.inspect_err(|_| view.set_status(JobStatus::Failed))?)
        }
        None => None,
    };
    let handles = run.spawn(control, coordinator.as_ref().map(|_| ack_tx))?;
    let sources = handles.iter().filter(|h| h.is_source).count();
    let (mut rule, mut progress) = (StopRule::new(), ProgressTicker::new());
    while handles.iter().any(|h| !h.thread.is_finished()) {
        std::thread::sleep(Duration::from_millis(10));
        let at_end = control.sources_at_end.load(Ordering::SeqCst) >= sources;
        let stopping = stop_requested.load(Ordering::SeqCst) || at_end;
        // A cancelled run takes no more checkpoints; its tasks end as soon as they can.
        let coordinator = coordinator.as_mut().filter(|_| !control.cancel.load(Ordering::SeqCst));
        match rule.tick(coordinator, &handles, &view, stopping) {
            Ok(true) => control.stop.store(true, Ordering::SeqCst),
            Ok(false) => {}
            Err(e) => control.fail(e),
        }
        progress.tick(&parts, config.progress_interval, run.started);
    }
    let started = run.started;
    if let Err(e) = run.finish(handles, control) {
        view.record_failure(e.to_string());
        view.set_status(JobStatus::Failed);
        return Err(e);
    }
    let stopped = stop_requested.load(Ordering::SeqCst);
    let asked = config.checkpoints.savepoint_on_stop.clone().or_else(|| view.stop_savepoint());
    let savepoint = match (asked, &coordinator) {
        (Some(name), Some(c)) if stopped => Some(c.savepoint_of_final_checkpoint(&name)?),
        _ => None,
    };
    view.set_status(if stopped { JobStatus::Canceled } else { JobStatus::Finished });
    Ok(JobResult {
        operators: parts.metrics.snapshot(),
        elapsed: started.elapsed(),
        last_checkpoint: coordinator.and_then(|c| c.last_completed),
        checkpoints: view.checkpoints(),
        savepoint,
    })
}
