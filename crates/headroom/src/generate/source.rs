//! The session the chunk loop pulls from: one engine's own, or rank 0's lead of a mesh.

use anyhow::Result;
use headroom_engine::replicated::{LeadSession, RankMemory};
use headroom_engine::{Chunk, Engine, Session};

/// A session as the chunk loop drives it: alone, or led on every rank of a mesh.
pub trait ChunkSource {
    /// Chunks the session will produce.
    fn chunks_total(&self) -> usize;
    /// The next chunk.
    fn next_chunk(&mut self) -> headroom_engine::Result<Chunk>;
    /// Ends the session: every rank's memory, when it ran on a mesh.
    fn finish(self: Box<Self>, engine: &Engine) -> Result<Option<Vec<RankMemory>>>;
}

impl ChunkSource for Session {
    fn chunks_total(&self) -> usize {
        Session::chunks_total(self).unwrap_or(0)
    }
    fn next_chunk(&mut self) -> headroom_engine::Result<Chunk> {
        Session::next_chunk(self)
    }
    fn finish(self: Box<Self>, _: &Engine) -> Result<Option<Vec<RankMemory>>> {
        Ok(None)
    }
}

impl ChunkSource for LeadSession {
    fn chunks_total(&self) -> usize {
        self.session().and_then(Session::chunks_total).unwrap_or(0)
    }
    fn next_chunk(&mut self) -> headroom_engine::Result<Chunk> {
        LeadSession::next_chunk(self)
    }
    fn finish(self: Box<Self>, engine: &Engine) -> Result<Option<Vec<RankMemory>>> {
        Ok(Some(self.close(engine)?))
    }
}
