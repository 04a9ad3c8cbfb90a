//! Why a client was refused a session, or turned away at the door: the reasons
//! `/metrics` counts.

/// Why the queue did not take a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// `max_queue` clients already wait.
    QueueFull,
    /// The client waited `queue_timeout` without being admitted.
    QueueTimeout,
    /// The KV pool cannot hold one more session even with the others done.
    KvPages,
    /// The session's decoder state and conditioning do not fit in memory.
    Memory,
    /// The server is shutting down.
    ShuttingDown,
    /// The server is draining: it finishes its sessions and takes no new one.
    Draining,
}

impl Refusal {
    /// Every reason, in the order `/metrics` lists them.
    pub const ALL: [Refusal; 6] = [
        Refusal::QueueFull,
        Refusal::QueueTimeout,
        Refusal::KvPages,
        Refusal::Memory,
        Refusal::ShuttingDown,
        Refusal::Draining,
    ];

    /// The `reason` label of `headroom_sessions_refused_total`.
    pub fn label(self) -> &'static str {
        match self {
            Refusal::QueueFull => "queue_full",
            Refusal::QueueTimeout => "queue_timeout",
            Refusal::KvPages => "kv_pages",
            Refusal::Memory => "memory",
            Refusal::ShuttingDown => "shutting_down",
            Refusal::Draining => "draining",
        }
    }

    /// The index of this reason in [`Refusal::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

/// Why the door turned a request away (the `reason` label of
/// `headroom_door_refusals_total`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DoorRefusal {
    /// No key, or not a key of this server.
    Key,
    /// A WebSocket upgrade from an origin that is not allowed.
    Origin,
    /// A socket past `--max-connections` with none waiting for its start.
    Connections,
    /// A socket that waited for its `session.start` closed to make room for a new one.
    IdleEvicted,
}

impl DoorRefusal {
    /// Every refusal, in the order of their counters.
    pub const ALL: [DoorRefusal; 4] = [
        DoorRefusal::Key,
        DoorRefusal::Origin,
        DoorRefusal::Connections,
        DoorRefusal::IdleEvicted,
    ];

    /// The metric label.
    pub fn label(self) -> &'static str {
        match self {
            DoorRefusal::Key => "key",
            DoorRefusal::Origin => "origin",
            DoorRefusal::Connections => "connections",
            DoorRefusal::IdleEvicted => "idle_evicted",
        }
    }

    /// Index into the counters.
    pub fn index(self) -> usize {
        self as usize
    }
}
