//! The connection table: how many connections the host serves at once, and which one gives way
//! when it is full.
//!
//! A cap on connections protects the host's file descriptors, but a fixed cap that simply
//! refuses newcomers lets a few hundred clients that never finish their request (half a head,
//! or a head announcing a body that never comes) lock everyone else out until they time out.
//! So, as a proxy's overload manager does, a full table sheds a connection that is costing a
//! place without doing work: one waiting for a request head (new, or idle between requests) or
//! for the rest of its request body, whichever has waited longest. Under a flood every
//! newcomer displaces the stalest, so the time a slow connection may keep its place shrinks
//! with the pressure, while a client that sends its request at once is served long before its
//! turn would come. A connection whose request is being answered is never shed; only when every
//! connection is being answered is a newcomer refused (503).

use std::collections::HashMap;
use std::pin::Pin;
use std::sync::{Arc, Mutex, PoisonError};
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame, SizeHint};
use tokio::sync::Notify;

use crate::runtime::outbound::MAX_OUTBOUND_SOCKETS;

/// The most bytes of request line and header fields a head may take, exactly; hyper answers a
/// larger one 431.
pub const MAX_HEADER_BYTES: usize = 64 * 1024;
/// Descriptors kept back from the connection cap for everything else the host opens: 256 for
/// store connections, log files, the compiled-component cache and the exporters' sockets, and
/// the guests' outgoing calls' sockets.
pub const RESERVED_FILE_DESCRIPTORS: u64 = 256 + MAX_OUTBOUND_SOCKETS as u64;
/// The smallest default cap, should the descriptor limit be tiny.
pub const MIN_DEFAULT_CONNECTIONS: usize = 64;

/// Where a connection is in its exchange, which decides whether it may be shed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Phase {
    /// Waiting for a request head: just accepted, or idle after a response.
    AwaitingHead,
    /// Its request's head has arrived; its body is still being read.
    ReadingBody,
    /// Its request is with the guest or its response is being written: never shed.
    Answering,
}

/// The connections served now, at most `cap` of them.
pub struct ConnectionTable {
    cap: usize,
    state: Mutex<TableState>,
}

#[derive(Default)]
struct TableState {
    next_id: u64,
    entries: HashMap<u64, Entry>,
}

struct Entry {
    phase: Phase,
    /// When the connection entered its phase.
    since: Instant,
    /// Told when the connection is shed; its task then drops it.
    shed: Arc<Notify>,
}

impl ConnectionTable {
    /// A table of at most `cap` connections.
    pub fn new(cap: usize) -> Arc<ConnectionTable> {
        Arc::new(ConnectionTable {
            cap,
            state: Mutex::new(TableState::default()),
        })
    }

    /// A place for a new connection, shedding one that is not being answered if the table is
    /// full; `None` when every connection in it is being answered.
    pub fn admit(self: &Arc<Self>) -> Option<Arc<Ticket>> {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        if state.entries.len() >= self.cap {
            let victim = state
                .entries
                .iter()
                .filter(|(_, entry)| entry.phase != Phase::Answering)
                .min_by_key(|(_, entry)| entry.since)
                .map(|(id, _)| *id)?;
            if let Some(entry) = state.entries.remove(&victim) {
                entry.shed.notify_one();
            }
        }
        let id = state.next_id;
        state.next_id += 1;
        let shed = Arc::new(Notify::new());
        state.entries.insert(
            id,
            Entry {
                phase: Phase::AwaitingHead,
                since: Instant::now(),
                shed: Arc::clone(&shed),
            },
        );
        Some(Arc::new(Ticket {
            table: Arc::clone(self),
            id,
            shed,
        }))
    }

    /// Connections in the table now.
    pub fn len(&self) -> usize {
        self.state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .len()
    }

    /// Whether the table holds no connection.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// One connection's place in the table, given up when dropped.
pub struct Ticket {
    table: Arc<ConnectionTable>,
    id: u64,
    shed: Arc<Notify>,
}

impl Ticket {
    /// Records that the connection entered `phase`.
    pub fn enter(&self, phase: Phase) {
        let mut state = self
            .table
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(entry) = state.entries.get_mut(&self.id) {
            entry.phase = phase;
            entry.since = Instant::now();
        }
    }

    /// Completes once the table has shed this connection.
    pub async fn shed(&self) {
        self.shed.notified().await;
    }
}

impl Drop for Ticket {
    fn drop(&mut self) {
        self.table
            .state
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .entries
            .remove(&self.id);
    }
}

/// A response body that puts its connection back to [`Phase::AwaitingHead`] once it has been
/// written (or abandoned): the connection then waits for its next request.
pub struct AwaitNextHead<B> {
    body: B,
    ticket: Arc<Ticket>,
}

impl<B> AwaitNextHead<B> {
    /// `body`, sent on the connection of `ticket`.
    pub fn new(body: B, ticket: Arc<Ticket>) -> AwaitNextHead<B> {
        AwaitNextHead { body, ticket }
    }
}

impl<B> Drop for AwaitNextHead<B> {
    fn drop(&mut self) {
        self.ticket.enter(Phase::AwaitingHead);
    }
}

impl<B: Body + Unpin> Body for AwaitNextHead<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        Pin::new(&mut self.body).poll_frame(cx)
    }

    fn is_end_stream(&self) -> bool {
        self.body.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.body.size_hint()
    }
}

/// The default connection cap: the process's open-file limit, raised to its hard limit first,
/// less [`RESERVED_FILE_DESCRIPTORS`], and no more connections than a quarter of `memory` holds
/// at [`MAX_HEADER_BYTES`] each (what a connection may buffer of a request head);
/// at least [`MIN_DEFAULT_CONNECTIONS`].
pub fn default_cap(memory: usize) -> usize {
    let by_descriptors =
        usize::try_from(raise_open_file_limit().saturating_sub(RESERVED_FILE_DESCRIPTORS))
            .unwrap_or(usize::MAX);
    let by_memory = memory / 4 / MAX_HEADER_BYTES;
    by_descriptors
        .min(by_memory)
        .clamp(MIN_DEFAULT_CONNECTIONS, 1_000_000)
}

/// Raises the soft limit on open files to the hard one, as servers do (the soft default of
/// 1,024 is a relic of `select`); returns the soft limit in force afterwards.
fn raise_open_file_limit() -> u64 {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: `limit` is a valid rlimit to write into.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) } != 0 {
        return 1024;
    }
    if limit.rlim_cur < limit.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: limit.rlim_max,
            rlim_max: limit.rlim_max,
        };
        // SAFETY: as above; a refusal leaves the old limit in force.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            return raised.rlim_cur;
        }
    }
    limit.rlim_cur
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_full_table_sheds_whichever_connection_has_waited_longest_for_its_head_or_body() {
        let table = ConnectionTable::new(3);
        let answering = table.admit().unwrap();
        answering.enter(Phase::Answering);
        let head = table.admit().unwrap();
        std::thread::sleep(std::time::Duration::from_millis(2));
        let body = table.admit().unwrap();
        body.enter(Phase::ReadingBody);
        assert_eq!(table.len(), 3);

        let newcomer = table.admit().expect("a waiting connection gives way");
        assert_eq!(table.len(), 3);
        assert!(
            futures_ready(head.shed()),
            "the one waiting longest was told"
        );
        assert!(!futures_ready(body.shed()));
        newcomer.enter(Phase::Answering);
        let _second = table.admit().expect("then the one waiting for its body");
        assert!(futures_ready(body.shed()));
        assert!(!futures_ready(answering.shed()), "never one being answered");
    }

    #[test]
    fn a_table_of_connections_all_being_answered_refuses_a_newcomer() {
        let table = ConnectionTable::new(2);
        let held: Vec<_> = (0..2).map(|_| table.admit().unwrap()).collect();
        for ticket in &held {
            ticket.enter(Phase::Answering);
        }
        assert!(table.admit().is_none());
        drop(held);
        assert!(table.is_empty());
        assert!(table.admit().is_some());
    }

    #[test]
    fn a_response_written_puts_its_connection_back_to_waiting_for_a_head() {
        let table = ConnectionTable::new(1);
        let ticket = table.admit().unwrap();
        ticket.enter(Phase::Answering);
        drop(AwaitNextHead::new((), Arc::clone(&ticket)));
        assert!(table.admit().is_some(), "an idle connection gives way");
        assert!(futures_ready(ticket.shed()));
    }

    #[test]
    fn the_default_cap_is_the_raised_open_file_limit_less_the_reserve_within_memory() {
        let roomy = 1 << 40;
        let cap = default_cap(roomy) as u64;
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: as in `raise_open_file_limit`.
        assert_eq!(
            unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) },
            0
        );
        assert_eq!(limit.rlim_cur, limit.rlim_max, "raised to the hard limit");
        let expected = limit
            .rlim_cur
            .saturating_sub(RESERVED_FILE_DESCRIPTORS)
            .clamp(MIN_DEFAULT_CONNECTIONS as u64, 1_000_000);
        assert_eq!(cap, expected);
        // A quarter of 1 GiB holds 4,096 heads of 64 KiB.
        assert_eq!(default_cap(1 << 30) as u64, expected.min(4_096));
    }

    /// Whether `future` completes at its first poll.
    fn futures_ready(future: impl std::future::Future<Output = ()>) -> bool {
        let waker = std::task::Waker::noop();
        let mut context = Context::from_waker(waker);
        let mut future = std::pin::pin!(future);
        future.as_mut().poll(&mut context).is_ready()
    }
}
