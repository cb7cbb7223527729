//! What the machine gives this process: its memory, or less where a memory cgroup (a
//! container's limit) says so. Several defaults are shares of it.

/// The memory this process may use: the machine's physical memory, or less where a memory
/// cgroup (a container's limit) says so.
pub fn machine_memory() -> usize {
    // SAFETY: sysconf has no preconditions.
    let (pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let physical = match (usize::try_from(pages), usize::try_from(page)) {
        (Ok(pages), Ok(page)) if pages > 0 => pages.saturating_mul(page),
        _ => usize::MAX,
    };
    physical.min(cgroup_memory_limit().unwrap_or(usize::MAX))
}

/// The memory limit of this process's cgroup, v2 (`memory.max`) or v1
/// (`memory.limit_in_bytes`), if it has one: under its path in the hierarchy, or at the
/// hierarchy's root where a container sees its own cgroup there (v1 without a cgroup namespace).
fn cgroup_memory_limit() -> Option<usize> {
    let membership = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    membership.lines().find_map(|line| {
        let mut fields = line.splitn(3, ':');
        let (_, controllers, path) = (fields.next()?, fields.next()?, fields.next()?);
        let (root, file) = if controllers.is_empty() {
            ("/sys/fs/cgroup", "memory.max")
        } else if controllers.split(',').any(|name| name == "memory") {
            ("/sys/fs/cgroup/memory", "memory.limit_in_bytes")
        } else {
            return None;
        };
        [format!("{root}{path}/{file}"), format!("{root}/{file}")]
            .iter()
            .find_map(|candidate| std::fs::read_to_string(candidate).ok())?
            .trim()
            .parse()
            .ok()
    })
}
