//! H.264 encoding of RGB frames with OpenH264, which `openh264-sys2` compiles from
//! its bundled C++ source (no system library, nothing downloaded).
//!
//! Frames are converted to YUV 4:2:0 with BT.601 limited-range coefficients (the
//! conversion OpenH264's `YUVBuffer` implements) and the SPS says so in its VUI, so
//! players do not guess BT.709.

use crate::{check, MediaError, Result};
use openh264::encoder::{
    EncodedBitStream, Encoder, EncoderConfig, FrameRate, FrameType, IntraFramePeriod,
    RateControlMode, VuiConfig,
};
use openh264::formats::{RgbSliceU8, YUVBuffer};
use openh264::{OpenH264API, Timestamp};

/// Largest frame rate accepted: keeps `fps * 1000` timescales far inside `u32`.
const MAX_FPS: u32 = 1000;

/// One encoded frame: Annex B NAL units (start-code prefixed).
#[derive(Debug)]
pub(crate) struct EncodedFrame {
    /// The access unit; an IDR one starts with SPS and PPS.
    pub annex_b: Vec<u8>,
    /// Whether the frame is an IDR picture (a point where decoding can start).
    pub keyframe: bool,
}

/// Checks that `width × height` at `fps` can be encoded, naming the problem otherwise.
pub fn check_h264_size(width: usize, height: usize, fps: u32) -> Result<()> {
    let reason = if width == 0 || height == 0 {
        Some("width and height must be positive")
    } else if !width.is_multiple_of(2) || !height.is_multiple_of(2) {
        // 4:2:0 halves both dimensions for the chroma planes.
        Some("width and height must be even (multiples of 16 encode best)")
    } else if width.max(height) > 3840 || width.min(height) > 2160 {
        // OpenH264 supports up to level 5.2.
        Some("OpenH264 encodes at most 3840x2160 (or 2160x3840)")
    } else if fps == 0 || fps > MAX_FPS {
        Some("the frame rate must be between 1 and 1000")
    } else {
        None
    };
    match reason {
        Some(reason) => Err(MediaError::VideoFormat {
            width,
            height,
            fps,
            reason,
        }),
        None => Ok(()),
    }
}

/// An OpenH264 encoder for one fixed size and frame rate.
pub(crate) struct H264Encoder {
    encoder: Encoder,
    yuv: YUVBuffer,
    width: usize,
    height: usize,
    fps: u32,
    frames: u64,
}

impl std::fmt::Debug for H264Encoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("H264Encoder")
            .field("width", &self.width)
            .field("height", &self.height)
            .field("fps", &self.fps)
            .field("frames", &self.frames)
            .finish_non_exhaustive()
    }
}

impl H264Encoder {
    /// Creates an encoder for `width × height` RGB frames at `fps`.
    pub(crate) fn new(width: usize, height: usize, fps: u32) -> Result<Self> {
        check_h264_size(width, height, fps)?;
        let config = EncoderConfig::new()
            // Constant quality (OpenH264's QP 26) instead of a bitrate target: rate
            // control without frame skipping cannot hold a bitrate anyway (OpenH264
            // warns on stderr), and skipping would drop frames from the timeline.
            .rate_control_mode(RateControlMode::Off)
            // One sample per input frame: the containers time frame i at i/fps.
            .skip_frames(false)
            .max_frame_rate(FrameRate::from_hz(fps as f32))
            // An IDR every 2 s so a plain MP4 seeks quickly.
            .intra_frame_period(IntraFramePeriod::from_num_frames(2 * fps))
            .vui(VuiConfig::bt601());
        let encoder = Encoder::with_api_config(OpenH264API::from_source(), config)
            .map_err(|e| MediaError::Encode(e.to_string()))?;
        Ok(Self {
            encoder,
            yuv: YUVBuffer::new(width, height),
            width,
            height,
            fps,
            frames: 0,
        })
    }

    /// Encodes one RGB frame; `force_idr` makes it an IDR picture.
    pub(crate) fn encode(&mut self, rgb: &[u8], force_idr: bool) -> Result<EncodedFrame> {
        check(self.width, self.height, rgb)?;
        self.yuv
            .read_rgb8(RgbSliceU8::new(rgb, (self.width, self.height)));
        // The first frame is always IDR; before it the encoder is not initialised,
        // so forcing would reach an uninitialised OpenH264 instance.
        if force_idr && self.frames > 0 {
            self.encoder.force_intra_frame();
        }
        let millis = self.frames * 1000 / u64::from(self.fps);
        let index = self.frames;
        let stream = self
            .encoder
            .encode_at(&self.yuv, Timestamp::from_millis(millis))
            .map_err(|e| MediaError::Encode(format!("frame {index}: {e}")))?;
        let frame = collect(&stream, index)?;
        if force_idr && !frame.keyframe {
            return Err(MediaError::Encode(format!(
                "frame {index}: an IDR picture was forced but the encoder made {:?}",
                stream.frame_type()
            )));
        }
        self.frames += 1;
        Ok(frame)
    }
}

/// Copies the bitstream out of OpenH264's buffer, rejecting skipped frames.
fn collect(stream: &EncodedBitStream<'_>, index: u64) -> Result<EncodedFrame> {
    let kind = stream.frame_type();
    let annex_b = stream.to_vec();
    if annex_b.is_empty() || matches!(kind, FrameType::Skip | FrameType::Invalid) {
        return Err(MediaError::Encode(format!(
            "frame {index}: the encoder produced no picture ({kind:?})"
        )));
    }
    Ok(EncodedFrame {
        annex_b,
        keyframe: kind == FrameType::IDR,
    })
}
