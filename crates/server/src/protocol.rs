//! Client → server messages of `WS /v1/realtime/video` (vLLM-Omni's realtime video API,
//! REFERENCE.md §6), parsed from untrusted JSON into checked requests.
//!
//! Every rule is checked here, with the field named in the error, before anything is
//! handed to a worker: a message either becomes a typed request or an `error` for the
//! client. Unknown fields are ignored, as vLLM-Omni ignores them. Types are read
//! leniently where pydantic (vLLM-Omni's validator) is lenient: an integer field takes
//! `33` or `33.0`, and `null` counts as absent.

use headroom_model::camera::{CameraUpdate, Keys, UpdateMode};
use headroom_model::DecoderKind;
use serde_json::{Map, Value};

use crate::config::{Defaults, Limits};
use crate::error::{Result, ServerError};

/// A client message, by its `type`.
#[derive(Debug)]
pub enum ClientMessage {
    /// `session.start` with its whole object (parsed by [`StartRequest::parse`]).
    Start(Map<String, Value>),
    /// `session.interaction` with its whole object (parsed by [`Interaction::parse`]).
    Interaction(Map<String, Value>),
    /// `session.ping`: refreshes the stall clock, answered with `session.pong`.
    Ping,
    /// `session.stop`: ends the session at the next chunk boundary.
    Stop,
    /// `session.pause`: parks the session at the next chunk boundary (its device bytes
    /// go to 0, its state stays in host memory); answered with `session.paused`.
    Pause,
    /// `session.resume`: brings a paused session back, through admission.
    Resume,
}

/// `extra_params.resume_token` of a `session.start`, if it carries one: 32 hex digits.
pub fn resume_token(msg: &Map<String, Value>) -> Result<Option<String>> {
    let field = "extra_params.resume_token";
    let Some(extra) = msg.get("extra_params") else {
        return Ok(None);
    };
    let Some(token) = extra.get("resume_token") else {
        return Ok(None);
    };
    match token {
        Value::Null => Ok(None),
        Value::String(t) if t.len() == 32 && t.bytes().all(|b| b.is_ascii_hexdigit()) => {
            Ok(Some(t.to_ascii_lowercase()))
        }
        Value::String(_) => Err(ServerError::request(
            field,
            "must be the 32 hex digits video.start gave",
        )),
        other => Err(ServerError::request(
            field,
            format!("must be a string, got {}", type_name(other)),
        )),
    }
}

impl ClientMessage {
    /// Parses one text message: a JSON object with a known `type`.
    pub fn parse(text: &str) -> Result<Self> {
        let value: Value = serde_json::from_str(text)
            .map_err(|e| ServerError::InvalidJson(format!("message is not valid JSON: {e}")))?;
        let Value::Object(map) = value else {
            return Err(ServerError::InvalidJson(
                "message must be a JSON object".to_string(),
            ));
        };
        let kind = match map.get("type") {
            Some(Value::String(kind)) => kind.clone(),
            Some(other) => {
                return Err(ServerError::request(
                    "type",
                    format!("must be a string, got {}", type_name(other)),
                ))
            }
            None => return Err(ServerError::request("type", "is missing")),
        };
        Ok(match kind.as_str() {
            "session.start" => ClientMessage::Start(map),
            "session.interaction" => ClientMessage::Interaction(map),
            "session.ping" => ClientMessage::Ping,
            "session.stop" => ClientMessage::Stop,
            "session.pause" => ClientMessage::Pause,
            "session.resume" => ClientMessage::Resume,
            _ => return Err(ServerError::UnknownType(truncate(&kind, 64))),
        })
    }
}

/// A checked `session.start`.
#[derive(Debug, Clone, PartialEq)]
pub struct StartRequest {
    /// The model the client names, if it names one (it must be the server's).
    pub model: Option<String>,
    /// Text prompt (empty and absent are the same).
    pub prompt: Option<String>,
    /// Width in pixels.
    pub width: usize,
    /// Height in pixels.
    pub height: usize,
    /// Frames (12·K − 3), or 0: the session streams until stopped.
    pub num_frames: usize,
    /// Frames per second of the stream.
    pub fps: u32,
    /// Noise seed.
    pub seed: u64,
    /// DMD steps per block.
    pub num_inference_steps: usize,
    /// Timestep shift (`None`: the model's `flow_shift`).
    pub flow_shift: Option<f64>,
    /// `image_reference.image_url`: a `data:` URL (decoded by the worker).
    pub image_url: Option<String>,
    /// `extra_params.camera_action_script`, flattened to one key set per latent frame.
    pub actions: Vec<Keys>,
    /// `extra_params.overlap`: decode a chunk while the next one denoises.
    pub overlap: bool,
    /// `extra_params.camera_guidance`: the session's camera guidance scale (`None`: the
    /// model's).
    pub camera_guidance: Option<f64>,
    /// `extra_params.decoder`: `"full"` or `"tiny"` (`None`: the server's default).
    pub decoder: Option<DecoderKind>,
    /// `extra_params.pace_to_media_time`, `pacing_lead_seconds`,
    /// `pacing_max_lag_seconds` ([`crate::pacer`]), the server's defaults filling in.
    pub pacing: crate::pacer::Pacing,
}

/// Largest width or height the H.264 encoder takes.
const MAX_SIDE: usize = 3840;
/// Latent frames per chunk of a camera action script.
const SCRIPT_FRAMES_PER_CHUNK: usize = 3;

impl StartRequest {
    /// Checks a `session.start` object, filling left-out fields from `defaults`.
    ///
    /// Like vLLM-Omni, keys of a `sampling_params` object count as top-level fields when
    /// the top level does not have them, and `extra_params.flow_shift` /
    /// `extra_params.seed` stand in for missing top-level ones.
    pub fn parse(msg: &Map<String, Value>, defaults: &Defaults) -> Result<Self> {
        let mut msg = msg.clone();
        let mut extra = match msg.remove("extra_params") {
            None | Some(Value::Null) => Map::new(),
            Some(Value::Object(m)) => m,
            Some(other) => {
                return Err(ServerError::request(
                    "extra_params",
                    format!("must be an object, got {}", type_name(&other)),
                ))
            }
        };
        if let Some(Value::Object(sampling)) = msg.remove("sampling_params") {
            for (key, value) in sampling {
                if START_FIELDS.contains(&key.as_str()) && !msg.contains_key(&key) {
                    msg.insert(key, value);
                } else {
                    extra.insert(key, value);
                }
            }
        }
        for key in ["flow_shift", "seed"] {
            if field(&msg, key).is_none() {
                if let Some(v) = extra.get(key) {
                    msg.insert(key.to_string(), v.clone());
                }
            }
        }
        match field(&msg, "format") {
            None => {}
            Some(Value::String(f)) if f == "m4s" => {}
            Some(other) => {
                return Err(ServerError::request(
                    "format",
                    format!("must be \"m4s\", got {}", short(other)),
                ))
            }
        }
        let (mut width, mut height) = (
            uint(&msg, "width", 16, MAX_SIDE)?,
            uint(&msg, "height", 16, MAX_SIDE)?,
        );
        if width.is_none() && height.is_none() {
            if let Some((w, h)) = size(&msg)? {
                (width, height) = (Some(w), Some(h));
            }
        }
        let pacing = crate::pacer::Pacing::parse(&extra, defaults.pacing)?;
        let request = Self {
            pacing,
            model: string(&msg, "model")?,
            prompt: string(&msg, "prompt")?,
            width: width.unwrap_or(defaults.width),
            height: height.unwrap_or(defaults.height),
            num_frames: uint(&msg, "num_frames", 0, MAX_FRAMES)?.unwrap_or(defaults.num_frames),
            fps: uint(&msg, "fps", 1, 120)?.map_or(defaults.fps, |f| f as u32),
            seed: seed(&msg)?.unwrap_or(defaults.seed),
            num_inference_steps: uint(&msg, "num_inference_steps", 1, 50)?
                .unwrap_or(defaults.num_inference_steps),
            flow_shift: float(&msg, "flow_shift")?.or(defaults.flow_shift),
            image_url: image_url(&msg)?,
            actions: action_script(extra.get("camera_action_script"))?,
            overlap: match extra.get("overlap") {
                None | Some(Value::Null) => false,
                Some(Value::Bool(b)) => *b,
                Some(other) => {
                    return Err(ServerError::request(
                        "extra_params.overlap",
                        format!("must be true or false, got {}", short(other)),
                    ))
                }
            },
            camera_guidance: match extra.get("camera_guidance") {
                None | Some(Value::Null) => None,
                Some(v) => Some(v.as_f64().ok_or_else(|| {
                    ServerError::request(
                        "extra_params.camera_guidance",
                        format!("must be a number, got {}", short(v)),
                    )
                })?),
            },
            decoder: match extra.get("decoder") {
                None | Some(Value::Null) => None,
                Some(Value::String(name)) => Some(name.parse().map_err(|_| {
                    ServerError::request(
                        "extra_params.decoder",
                        format!("must be \"full\" or \"tiny\", got {name:?}"),
                    )
                })?),
                Some(other) => {
                    return Err(ServerError::request(
                        "extra_params.decoder",
                        format!("must be \"full\" or \"tiny\", got {}", short(other)),
                    ))
                }
            },
        };
        if let Some(rule) = request
            .camera_guidance
            .and_then(headroom_model::dmd::guidance_scale_error)
        {
            return Err(ServerError::request("extra_params.camera_guidance", rule));
        }
        if let Some(rule) = request
            .flow_shift
            .and_then(headroom_model::dmd::flow_shift_error)
        {
            return Err(ServerError::request("flow_shift", rule));
        }
        Ok(request)
    }

    /// Chunks the request makes (`num_frames = 12·K − 3`); `None` for a session that
    /// streams until stopped.
    pub fn chunks(&self) -> Option<usize> {
        (self.num_frames != 0).then_some((self.num_frames + 3) / 12)
    }

    /// The accepted configuration echoed in `video.start` (the image as a flag, not
    /// bytes; the decoder the session gets, `default_decoder` when it named none).
    pub fn config(&self, model: &str, default_decoder: DecoderKind) -> Value {
        serde_json::json!({
            "model": model,
            "prompt": self.prompt,
            "width": self.width,
            "height": self.height,
            "num_frames": self.num_frames,
            "fps": self.fps,
            "seed": self.seed,
            "num_inference_steps": self.num_inference_steps,
            "flow_shift": self.flow_shift,
            "image_reference": self.image_url.is_some(),
            "camera_action_script": !self.actions.is_empty(),
            "camera_guidance": self.camera_guidance,
            "decoder": self.decoder.unwrap_or(default_decoder).as_str(),
            "pace_to_media_time": self.pacing.enabled,
            "pacing_lead_seconds": self.pacing.lead.as_secs_f64(),
            "pacing_max_lag_seconds": self.pacing.max_lag.as_secs_f64(),
            "chunks": self.chunks(),
        })
    }
}

/// Most frames a `session.start` may name (the engine has no bound of its own; this
/// keeps the number a count of frames rather than an overflow).
const MAX_FRAMES: usize = 1 << 40;

/// Top-level `session.start` fields a `sampling_params` key may fill.
const START_FIELDS: [&str; 9] = [
    "width",
    "height",
    "size",
    "num_frames",
    "fps",
    "seed",
    "num_inference_steps",
    "flow_shift",
    "prompt",
];

/// A checked `session.interaction`.
#[derive(Debug, Clone, PartialEq)]
pub struct Interaction {
    /// The event's id (given, or made by the server when absent).
    pub event_id: String,
    /// `event.prompt`, if non-empty.
    pub prompt: Option<String>,
    /// `event.multi_modal_data.camera`, if present.
    pub camera: Option<CameraUpdate>,
    /// Chunks the prompt blends over: `transition_chunks`, 3 when absent.
    pub prompt_transition: f64,
    /// When the server read it: where in the coming chunk it starts, and its latency.
    pub received_at: std::time::Instant,
}

impl Interaction {
    /// Checks a `session.interaction` object; `fresh_id` names an event without an id.
    pub fn parse(
        msg: &Map<String, Value>,
        limits: &Limits,
        fresh_id: impl FnOnce() -> String,
    ) -> Result<Self> {
        let Some(Value::Object(interaction)) = field(msg, "interaction") else {
            return Err(ServerError::request(
                "interaction",
                "must be an object {event_id, event, transition_chunks?}",
            ));
        };
        let event_id = match field(interaction, "event_id") {
            None => fresh_id(),
            Some(Value::String(id)) if !id.is_empty() && id.len() <= limits.event_id_bytes => {
                id.clone()
            }
            Some(other) => {
                return Err(ServerError::request(
                    "interaction.event_id",
                    format!(
                        "must be a non-empty string of at most {} bytes, got {}",
                        limits.event_id_bytes,
                        short(other)
                    ),
                ))
            }
        };
        let Some(Value::Object(event)) = field(interaction, "event") else {
            return Err(ServerError::request(
                "interaction.event",
                "must be an object {prompt?, multi_modal_data?}",
            ));
        };
        // Absent: a camera moves over one chunk and a prompt blends over three.
        let given = match field(interaction, "transition_chunks") {
            None => None,
            Some(v) => match integral(v) {
                Some(n) if n >= 0.0 => Some(n),
                _ => {
                    return Err(ServerError::request(
                        "interaction.transition_chunks",
                        format!("must be an integer >= 0, got {}", short(v)),
                    ))
                }
            },
        };
        let prompt = string(event, "prompt")
            .map_err(|e| rename(e, "interaction.event.prompt"))?
            .filter(|p| !p.trim().is_empty());
        let camera = match field(event, "multi_modal_data") {
            None => None,
            Some(Value::Object(mm)) => match field(mm, "camera") {
                None => None,
                Some(camera) => Some(camera_update(camera, given.unwrap_or(1.0))?),
            },
            Some(other) => {
                return Err(ServerError::request(
                    "interaction.event.multi_modal_data",
                    format!("must be an object, got {}", type_name(other)),
                ))
            }
        };
        if prompt.is_none() && camera.is_none() {
            return Err(ServerError::request(
                "interaction.event",
                "needs a non-empty prompt or multi_modal_data.camera",
            ));
        }
        Ok(Self {
            event_id,
            prompt,
            camera,
            prompt_transition: given.unwrap_or(3.0),
            received_at: std::time::Instant::now(),
        })
    }
}

/// `{mode, data {translation, rotation}}` → a checked camera update (STEPWISE A6).
fn camera_update(camera: &Value, transition_chunks: f64) -> Result<CameraUpdate> {
    const FIELD: &str = "interaction.event.multi_modal_data.camera";
    let Value::Object(camera) = camera else {
        return Err(ServerError::request(
            FIELD,
            "must be an object {mode, data {translation, rotation}}",
        ));
    };
    let mode = match field(camera, "mode") {
        None => UpdateMode::Target,
        Some(Value::String(m)) if m == "target" => UpdateMode::Target,
        Some(Value::String(m)) if m == "velocity" => UpdateMode::Velocity,
        Some(other) => {
            return Err(ServerError::request(
                format!("{FIELD}.mode"),
                format!("must be \"target\" or \"velocity\", got {}", short(other)),
            ))
        }
    };
    let empty = Map::new();
    let data = match field(camera, "data") {
        None => &empty,
        Some(Value::Object(d)) => d,
        Some(other) => {
            return Err(ServerError::request(
                format!("{FIELD}.data"),
                format!("must be an object, got {}", type_name(other)),
            ))
        }
    };
    if data.contains_key("actions") {
        return Err(ServerError::request(
            format!("{FIELD}.data.actions"),
            "raw keys are not a camera update; send translation and rotation (or use extra_params.camera_action_script at session.start)",
        ));
    }
    let translation = numbers::<3>(data, "translation", FIELD)?.unwrap_or([0.0; 3]);
    let rotation = numbers::<4>(data, "rotation", FIELD)?.unwrap_or([0.0, 0.0, 0.0, 1.0]);
    CameraUpdate {
        mode,
        translation,
        rotation,
        transition_chunks,
    }
    .validated()
    .map_err(|e| ServerError::request(FIELD, e.to_string()))
}

fn numbers<const N: usize>(
    data: &Map<String, Value>,
    key: &str,
    at: &str,
) -> Result<Option<[f64; N]>> {
    let Some(value) = field(data, key) else {
        return Ok(None);
    };
    let bad = || {
        ServerError::request(
            format!("{at}.data.{key}"),
            format!(
                "must be an array of {N} finite numbers, got {}",
                short(value)
            ),
        )
    };
    let Value::Array(items) = value else {
        return Err(bad());
    };
    if items.len() != N {
        return Err(bad());
    }
    let mut out = [0.0; N];
    for (o, item) in out.iter_mut().zip(items) {
        *o = item.as_f64().filter(|v| v.is_finite()).ok_or_else(bad)?;
    }
    Ok(Some(out))
}

/// `extra_params.camera_action_script`: one entry per chunk, each exactly 3 key sets
/// (one per latent frame); a key set is a list of key names (`["w", "d"]`) or a string
/// (`"wd"`).
fn action_script(script: Option<&Value>) -> Result<Vec<Keys>> {
    const FIELD: &str = "extra_params.camera_action_script";
    let chunks = match script {
        None | Some(Value::Null) => return Ok(Vec::new()),
        Some(Value::Array(chunks)) => chunks,
        Some(other) => {
            return Err(ServerError::request(
                FIELD,
                format!("must be a list of chunks, got {}", type_name(other)),
            ))
        }
    };
    let mut keys = Vec::with_capacity(chunks.len() * SCRIPT_FRAMES_PER_CHUNK);
    for (c, chunk) in chunks.iter().enumerate() {
        let frames = match chunk {
            Value::Array(frames) if frames.len() == SCRIPT_FRAMES_PER_CHUNK => frames,
            _ => {
                return Err(ServerError::request(
                    format!("{FIELD}[{c}]"),
                    format!("must hold exactly {SCRIPT_FRAMES_PER_CHUNK} action lists (one per latent frame)"),
                ))
            }
        };
        for (f, frame) in frames.iter().enumerate() {
            let at = || format!("{FIELD}[{c}][{f}]");
            let text = match frame {
                Value::String(s) => s.clone(),
                Value::Array(names) => {
                    let mut text = String::new();
                    for name in names {
                        match name {
                            Value::String(s) => text.push_str(s),
                            other => {
                                return Err(ServerError::request(
                                    at(),
                                    format!("key names must be strings, got {}", short(other)),
                                ))
                            }
                        }
                    }
                    text
                }
                other => {
                    return Err(ServerError::request(
                        at(),
                        format!(
                            "must be a list of key names or a string, got {}",
                            short(other)
                        ),
                    ))
                }
            };
            keys.push(Keys::parse(&text).map_err(|e| ServerError::request(at(), e.to_string()))?);
        }
    }
    Ok(keys)
}

fn image_url(msg: &Map<String, Value>) -> Result<Option<String>> {
    match field(msg, "image_reference") {
        None => Ok(None),
        Some(Value::String(url)) => Ok(Some(url.clone())),
        Some(Value::Object(r)) => match field(r, "image_url") {
            None => Ok(None),
            Some(Value::String(url)) => Ok(Some(url.clone())),
            Some(Value::Object(u)) => match field(u, "url") {
                Some(Value::String(url)) => Ok(Some(url.clone())),
                _ => Err(ServerError::request(
                    "image_reference.image_url.url",
                    "must be a string",
                )),
            },
            Some(other) => Err(ServerError::request(
                "image_reference.image_url",
                format!("must be a string (a data: URL), got {}", type_name(other)),
            )),
        },
        Some(other) => Err(ServerError::request(
            "image_reference",
            format!("must be an object {{image_url}}, got {}", type_name(other)),
        )),
    }
}

/// A field, with `null` read as absent.
fn field<'a>(map: &'a Map<String, Value>, key: &str) -> Option<&'a Value> {
    map.get(key).filter(|v| !v.is_null())
}

fn string(map: &Map<String, Value>, key: &str) -> Result<Option<String>> {
    match field(map, key) {
        None => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(other) => Err(ServerError::request(
            key,
            format!("must be a string, got {}", type_name(other)),
        )),
    }
}

/// An integral JSON number (`33` or `33.0`) as f64.
fn integral(value: &Value) -> Option<f64> {
    let v = value.as_f64()?;
    (v.is_finite() && v.fract() == 0.0).then_some(v)
}

fn uint(map: &Map<String, Value>, key: &str, min: usize, max: usize) -> Result<Option<usize>> {
    let Some(value) = field(map, key) else {
        return Ok(None);
    };
    match integral(value) {
        Some(v) if v >= min as f64 && v <= max as f64 => Ok(Some(v as usize)),
        _ => Err(ServerError::request(
            key,
            format!("must be an integer in {min}..={max}, got {}", short(value)),
        )),
    }
}

fn float(map: &Map<String, Value>, key: &str) -> Result<Option<f64>> {
    let Some(value) = field(map, key) else {
        return Ok(None);
    };
    value
        .as_f64()
        .map(Some)
        .ok_or_else(|| ServerError::request(key, format!("must be a number, got {}", short(value))))
}

fn seed(map: &Map<String, Value>) -> Result<Option<u64>> {
    let Some(value) = field(map, "seed") else {
        return Ok(None);
    };
    if let Some(s) = value.as_u64() {
        return Ok(Some(s));
    }
    match integral(value) {
        Some(v) if (0.0..=u64::MAX as f64).contains(&v) => Ok(Some(v as u64)),
        _ => Err(ServerError::request(
            "seed",
            format!("must be an integer in 0..=2^64-1, got {}", short(value)),
        )),
    }
}

/// `size: "WxH"` (vLLM-Omni's alternative to width and height).
fn size(map: &Map<String, Value>) -> Result<Option<(usize, usize)>> {
    let Some(value) = field(map, "size") else {
        return Ok(None);
    };
    let bad = || {
        ServerError::request(
            "size",
            format!(
                "must be \"WIDTHxHEIGHT\" with sides in 16..={MAX_SIDE}, got {}",
                short(value)
            ),
        )
    };
    let Value::String(s) = value else {
        return Err(bad());
    };
    let (w, h) = s.split_once(['x', 'X']).ok_or_else(bad)?;
    let parse = |t: &str| {
        t.trim()
            .parse::<usize>()
            .ok()
            .filter(|v| (16..=MAX_SIDE).contains(v))
    };
    match (parse(w), parse(h)) {
        (Some(w), Some(h)) => Ok(Some((w, h))),
        _ => Err(bad()),
    }
}

fn rename(error: ServerError, field: &str) -> ServerError {
    match error {
        ServerError::InvalidRequest { rule, .. } => ServerError::request(field, rule),
        other => other,
    }
}

/// The JSON type of a value, for messages.
pub fn type_name(value: &Value) -> &'static str {
    match value {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// A value as short JSON text for messages (a client may send megabytes).
fn short(value: &Value) -> String {
    truncate(&value.to_string(), 64)
}

fn truncate(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn start(json: &str) -> Result<StartRequest> {
        let ClientMessage::Start(map) = ClientMessage::parse(json)? else {
            panic!("not a start")
        };
        StartRequest::parse(&map, &Defaults::default())
    }

    fn interaction(json: &str) -> Result<Interaction> {
        let ClientMessage::Interaction(map) = ClientMessage::parse(json)? else {
            panic!("not an interaction")
        };
        Interaction::parse(&map, &Limits::default(), || "fresh".to_string())
    }

    #[test]
    fn a_start_fills_defaults_and_ignores_unknown_fields() {
        let r = start(r#"{"type":"session.start","num_frames":21,"whatever":{"x":1},"width":48.0,"height":32}"#)
            .unwrap();
        assert_eq!(
            (r.width, r.height, r.num_frames, r.chunks()),
            (48, 32, 21, Some(2))
        );
        assert_eq!((r.fps, r.seed, r.num_inference_steps), (16, 42, 4));
        assert_eq!(r.flow_shift, None, "the model's shift");
    }

    #[test]
    fn the_decoder_is_taken_from_extra_params_and_echoed() {
        let r = start(r#"{"type":"session.start","extra_params":{"decoder":"tiny"}}"#).unwrap();
        assert_eq!(r.decoder, Some(DecoderKind::Tiny));
        assert_eq!(r.config("m", DecoderKind::Full)["decoder"], "tiny");
    }

    #[test]
    fn sampling_params_and_extra_params_fill_missing_top_level_fields() {
        let r = start(
            r#"{"type":"session.start","sampling_params":{"seed":7,"num_frames":9},
               "extra_params":{"flow_shift":3.0,"camera_guidance":2,"camera_action_script":[[["w"],[],"wd"]]},"size":"64x48"}"#,
        )
        .unwrap();
        assert_eq!((r.seed, r.num_frames, r.flow_shift), (7, 9, Some(3.0)));
        assert_eq!(r.camera_guidance, Some(2.0));
        assert_eq!(r.decoder, None);
        assert_eq!(r.config("m", DecoderKind::Full)["decoder"], "full");
        assert_eq!((r.width, r.height), (64, 48));
        assert_eq!(r.actions.len(), 3);
        assert!(r.actions[0].w && !r.actions[1].w && r.actions[2].d);
    }

    #[test]
    fn bad_start_fields_are_named_with_their_rule() {
        for (json, field) in [
            (r#"{"type":"session.start","fps":0}"#, "fps"),
            (r#"{"type":"session.start","width":"wide"}"#, "width"),
            (r#"{"type":"session.start","seed":-1}"#, "seed"),
            (r#"{"type":"session.start","format":"mp4"}"#, "format"),
            (r#"{"type":"session.start","flow_shift":-2}"#, "flow_shift"),
            (r#"{"type":"session.start","prompt":5}"#, "prompt"),
            (
                r#"{"type":"session.start","extra_params":{"camera_guidance":-1}}"#,
                "extra_params.camera_guidance",
            ),
            (
                r#"{"type":"session.start","extra_params":{"camera_guidance":"2"}}"#,
                "extra_params.camera_guidance",
            ),
            (
                r#"{"type":"session.start","extra_params":{"decoder":"small"}}"#,
                "extra_params.decoder",
            ),
            (
                r#"{"type":"session.start","extra_params":{"decoder":1}}"#,
                "extra_params.decoder",
            ),
            (
                r#"{"type":"session.start","extra_params":{"camera_action_script":[["w"]]}}"#,
                "camera_action_script[0]",
            ),
            (
                r#"{"type":"session.start","extra_params":{"camera_action_script":[["w","q","w"]]}}"#,
                "camera_action_script[0][1]",
            ),
            (
                r#"{"type":"session.start","image_reference":{"image_url":3}}"#,
                "image_reference.image_url",
            ),
        ] {
            let err = start(json).unwrap_err();
            assert_eq!(err.code(), "invalid_request", "{json}");
            assert!(err.to_string().contains(field), "{json}: {err}");
        }
    }

    #[test]
    fn message_types_and_json_errors_have_their_codes() {
        assert_eq!(
            ClientMessage::parse("{").unwrap_err().code(),
            "invalid_json"
        );
        assert_eq!(
            ClientMessage::parse("[1]").unwrap_err().code(),
            "invalid_json"
        );
        assert_eq!(
            ClientMessage::parse(r#"{"type":"session.dance"}"#)
                .unwrap_err()
                .code(),
            "unknown_type"
        );
        assert_eq!(
            ClientMessage::parse(r#"{"type":7}"#).unwrap_err().code(),
            "invalid_request"
        );
        assert!(matches!(
            ClientMessage::parse(r#"{"type":"session.ping","extra":1}"#).unwrap(),
            ClientMessage::Ping
        ));
    }

    #[test]
    fn a_camera_interaction_defaults_to_target_and_normalises_rotation() {
        let i = interaction(
            r#"{"type":"session.interaction","interaction":{"event_id":"e1",
               "event":{"multi_modal_data":{"camera":{"data":{"rotation":[0,0,0,2]}}}}}}"#,
        )
        .unwrap();
        let cam = i.camera.unwrap();
        assert_eq!(i.event_id, "e1");
        assert_eq!(cam.mode, UpdateMode::Target);
        assert_eq!(cam.rotation, [0.0, 0.0, 0.0, 1.0]);
        assert_eq!(cam.transition_chunks, 1.0);
        let v = interaction(
            r#"{"type":"session.interaction","interaction":{"transition_chunks":0,
               "event":{"multi_modal_data":{"camera":{"mode":"velocity","data":{"translation":[0,0,0.05]}}}}}}"#,
        )
        .unwrap();
        assert_eq!(v.event_id, "fresh");
        assert_eq!(v.camera.unwrap().mode, UpdateMode::Velocity);
    }

    #[test]
    fn bad_interactions_are_refused_with_the_field() {
        for (json, field) in [
            (r#"{"type":"session.interaction"}"#, "interaction"),
            (
                r#"{"type":"session.interaction","interaction":{"event":{}}}"#,
                "interaction.event",
            ),
            (
                r#"{"type":"session.interaction","interaction":{"event_id":"","event":{"prompt":"x"}}}"#,
                "event_id",
            ),
            (
                r#"{"type":"session.interaction","interaction":{"transition_chunks":1.5,"event":{"prompt":"x"}}}"#,
                "transition_chunks",
            ),
            (
                r#"{"type":"session.interaction","interaction":{"event":{"multi_modal_data":{"camera":{"mode":"spin"}}}}}"#,
                "camera.mode",
            ),
            (
                r#"{"type":"session.interaction","interaction":{"event":{"multi_modal_data":{"camera":{"data":{"actions":["w"]}}}}}}"#,
                "data.actions",
            ),
            (
                r#"{"type":"session.interaction","interaction":{"event":{"multi_modal_data":{"camera":{"data":{"translation":[1,2]}}}}}}"#,
                "data.translation",
            ),
        ] {
            let err = interaction(json).unwrap_err();
            assert_eq!(err.code(), "invalid_request", "{json}");
            assert!(err.to_string().contains(field), "{json}: {err}");
        }
    }
}
