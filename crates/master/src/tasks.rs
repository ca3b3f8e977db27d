//! Copy/move tasks (spec/master.md §9).

#[derive(Debug, Default)]
pub(crate) struct TaskManager {}
