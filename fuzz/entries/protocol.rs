//! The `protocol` target's body, shared by the fuzz target and the server's corpus
//! replay: a client text message parsed, then its start or interaction checked as a
//! session would, with a camera update stepped one chunk.

use headroom_model::camera::InteractionHandler;
use headroom_model::DecoderKind;
use headroom_server::protocol::{ClientMessage, Interaction, StartRequest};
use headroom_server::{Defaults, Limits};

/// Runs one input of the `protocol` target.
pub fn protocol(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    match ClientMessage::parse(text) {
        Ok(ClientMessage::Start(map)) => {
            if let Ok(start) = StartRequest::parse(&map, &Defaults::default()) {
                let _ = start.config("small", DecoderKind::Full);
            }
        }
        Ok(ClientMessage::Interaction(map)) => {
            if let Ok(event) = Interaction::parse(&map, &Limits::default(), || "e".into()) {
                if let Some(camera) = event.camera {
                    let mut handler = InteractionHandler::default();
                    if handler.queue(camera).is_ok() {
                        let _ = handler.step_chunk(3);
                    }
                }
            }
        }
        _ => {}
    }
}
