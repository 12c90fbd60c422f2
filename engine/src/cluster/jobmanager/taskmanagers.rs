//! The job manager's view of its task managers: slots, which executor uses which, when
//! each was last heard from — and where executor events go (to the job that owns them).

use crate::cluster::protocol::{FromExecutor, Link, Sender};
use crate::job::now_ms;
use crossbeam_channel::Sender as ChannelSender;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use std::collections::{BTreeMap, HashMap};
use std::time::Instant;

/// One registered task manager.
#[derive(Debug)]
pub(crate) struct TaskManagerEntry {
    pub(crate) location: String,
    pub(crate) slots: u32,
    /// Slots in use, by executor id.
    pub(crate) used: BTreeMap<String, u32>,
    pub(crate) sender: Sender,
    pub(crate) last_seen: Instant,
    pub(crate) registered_ms: i64,
}

impl TaskManagerEntry {
    fn free(&self) -> u32 {
        self.slots.saturating_sub(self.used.values().sum())
    }
}

/// A task manager as `GET /api/v1/cluster` shows it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct TaskManagerView {
    /// Its name.
    pub name: String,
    /// Host and process id.
    pub location: String,
    /// Slots offered.
    pub slots: u32,
    /// Slots free.
    pub free_slots: u32,
    /// Executors running there.
    pub executors: Vec<String>,
    /// Registration time, ms since the epoch.
    pub registered_ms: i64,
    /// Time since its last heartbeat, ms.
    pub last_heartbeat_ms_ago: u64,
}

/// Slots reserved on one task manager for one executor.
#[derive(Debug)]
pub(crate) struct Placement {
    pub(crate) task_manager: String,
    pub(crate) executor_id: String,
    pub(crate) sender: Sender,
    /// Slot indices (= the subtask indices the executor runs).
    pub(crate) slots: Vec<u32>,
}

/// What happens to an executor, delivered to the job that started it.
#[derive(Debug)]
pub(crate) enum ExecutorEvent {
    /// It connected to the control port.
    Connected(Link<FromExecutor>),
    /// Its process ended.
    Exited(String),
    /// Its task manager could not start it.
    StartFailed(String),
    /// Its task manager is gone.
    TaskManagerLost(String),
}

/// Every task manager, and the routes of executor events.
#[derive(Debug, Default)]
pub(crate) struct TaskManagers {
    entries: Mutex<BTreeMap<String, TaskManagerEntry>>,
    routes: Mutex<HashMap<String, ChannelSender<(String, ExecutorEvent)>>>,
}

impl TaskManagers {
    /// Adds a task manager; refused when a live one has that name.
    pub(crate) fn register(
        &self,
        name: &str,
        slots: u32,
        location: &str,
        sender: Sender,
    ) -> Result<(), String> {
        let mut e = self.entries.lock();
        if let Some(old) = e.get(name) {
            return Err(format!(
                "a task manager named `{name}` is already registered ({}): give each one its own --name",
                old.location
            ));
        }
        e.insert(
            name.to_string(),
            TaskManagerEntry {
                location: location.to_string(),
                slots,
                used: BTreeMap::new(),
                sender,
                last_seen: Instant::now(),
                registered_ms: now_ms(),
            },
        );
        Ok(())
    }

    /// Removes a task manager; its executors get `TaskManagerLost(cause)`.
    pub(crate) fn remove(&self, name: &str, cause: &str) {
        let entry = self.entries.lock().remove(name);
        if let Some(entry) = entry {
            for executor in entry.used.keys() {
                self.route(executor, ExecutorEvent::TaskManagerLost(cause.to_string()));
            }
        }
    }

    pub(crate) fn touch(&self, name: &str) {
        if let Some(e) = self.entries.lock().get_mut(name) {
            e.last_seen = Instant::now();
        }
    }

    /// Reserves `n` slots, spread over the task managers (most free first, slot indices
    /// dealt round-robin): one [`Placement`] per task manager used. `executor_id`
    /// names the executor each task manager will run for them (given its position).
    pub(crate) fn allocate(&self, n: u32, executor_id: impl Fn(usize) -> String) -> Option<Vec<Placement>> {
        let mut e = self.entries.lock();
        if e.values().map(TaskManagerEntry::free).sum::<u32>() < n {
            return None;
        }
        let mut order: Vec<(String, u32)> =
            e.iter().filter(|(_, t)| t.free() > 0).map(|(name, t)| (name.clone(), t.free())).collect();
        order.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        let mut dealt: Vec<Vec<u32>> = vec![Vec::new(); order.len()];
        let mut next = 0;
        for slot in 0..n {
            while order[next % order.len()].1 == 0 {
                next += 1;
            }
            let i = next % order.len();
            order[i].1 -= 1;
            dealt[i].push(slot);
            next += 1;
        }
        let mut placed = Vec::new();
        for ((name, _), slots) in order.into_iter().zip(dealt).filter(|(_, s)| !s.is_empty()) {
            let id = executor_id(placed.len());
            let entry = e.get_mut(&name)?;
            entry.used.insert(id.clone(), slots.len() as u32);
            placed.push(Placement {
                task_manager: name,
                executor_id: id,
                sender: entry.sender.clone(),
                slots,
            });
        }
        Some(placed)
    }

    /// Frees the slots of `executor`.
    pub(crate) fn release(&self, executor: &str) {
        for entry in self.entries.lock().values_mut() {
            entry.used.remove(executor);
        }
    }

    /// (free slots, total slots, largest task manager's slots, task managers).
    pub(crate) fn capacity(&self) -> (u32, u32, u32, usize) {
        let e = self.entries.lock();
        let free = e.values().map(TaskManagerEntry::free).sum();
        let total = e.values().map(|t| t.slots).sum();
        let largest = e.values().map(|t| t.slots).max().unwrap_or(0);
        (free, total, largest, e.len())
    }

    /// Every task manager, for display.
    pub(crate) fn views(&self) -> Vec<TaskManagerView> {
        self.entries
            .lock()
            .iter()
            .map(|(name, t)| TaskManagerView {
                name: name.clone(),
                location: t.location.clone(),
                slots: t.slots,
                free_slots: t.free(),
                executors: t.used.keys().cloned().collect(),
                registered_ms: t.registered_ms,
                last_heartbeat_ms_ago: t.last_seen.elapsed().as_millis() as u64,
            })
            .collect()
    }

    /// Deliver executor events for `executor` to `to` from now on.
    pub(crate) fn add_route(&self, executor: &str, to: ChannelSender<(String, ExecutorEvent)>) {
        self.routes.lock().insert(executor.to_string(), to);
    }

    pub(crate) fn remove_route(&self, executor: &str) {
        self.routes.lock().remove(executor);
    }

    /// Delivers `event`; false when no job owns `executor` (a stale executor).
    pub(crate) fn route(&self, executor: &str, event: ExecutorEvent) -> bool {
        match self.routes.lock().get(executor) {
            Some(to) => to.send((executor.to_string(), event)).is_ok(),
            None => false,
        }
    }
}
