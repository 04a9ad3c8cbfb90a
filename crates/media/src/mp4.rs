//! H.264 video in MP4: a file writer and an in-memory fragmented-MP4 producer.
//!
//! Frames are encoded with OpenH264 (see `h264.rs`); every frame becomes one sample
//! timed at `i / fps` seconds lasting `1 / fps`.
//!
//! - [`Mp4Writer`] hands the access units to `muxide`, which writes `ftyp`, then
//!   `moov` (`mvhd`, one `trak` with an `avc1`/`avcC` sample entry and the sample
//!   tables), then one `mdat` ("fast start": a browser can play before the whole file
//!   arrives). muxide's media timescale is 90 kHz, so timestamps are exact for every
//!   frame rate dividing 90000 (16, 24, 25, 30, 60, ...) and otherwise within 1/180000 s.
//! - [`FragmentedMp4`] returns bytes for a browser's `MediaSource`: the first call
//!   yields the init segment (`ftyp` + `moov` with `mvex`/`trex` and empty sample
//!   tables, built by muxide from the stream's SPS/PPS), and every call yields one
//!   media fragment, `moof` (`mfhd`, `traf` with `tfhd`, `tfdt`, `trun`) + `mdat`.
//!   The fragment boxes are written here rather than by muxide's `flush_segment`,
//!   which times a one-frame fragment as 1/30 s whatever the frame rate. The media
//!   timescale is a multiple of `fps`, so fragment times are exact.
//!
//! Each fragment starts with a forced IDR picture: a client that joins late, or
//! drops a fragment, can start decoding at any fragment with only the init segment.
//! Parameter sets stay in-band in IDR samples too (as muxide does for plain MP4).

use crate::h264::{EncodedFrame, H264Encoder};
use crate::{io, MediaError, Result};
use muxide::api::{Muxer, MuxerBuilder, VideoCodec};
use muxide::codec::{annexb_to_avcc, extract_avc_config};
use muxide::fragmented::{FragmentConfig, FragmentedMuxer};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

/// Track id of the video track in muxide's fragmented init segment.
const TRACK_ID: u32 = 1;
/// `tfhd` flag: sample data offsets are relative to the start of the `moof`.
const DEFAULT_BASE_IS_MOOF: u32 = 0x02_0000;
/// `trun` flags: data offset, then per-sample duration, size and flags.
const TRUN_FLAGS: u32 = 0x01 | 0x100 | 0x200 | 0x400;
/// Sample flags of an IDR sample: depends on no other sample, sync.
const SYNC_SAMPLE: u32 = 0x0200_0000;
/// Sample flags of a P sample: depends on others, not a sync sample.
const NON_SYNC_SAMPLE: u32 = 0x0101_0000;

fn mux_error(e: impl std::fmt::Display) -> MediaError {
    MediaError::Mux(e.to_string())
}

/// The media timescale for `fps`: 90 kHz when that is exact, else `fps · 1000`.
fn timescale(fps: u32) -> u32 {
    if 90_000u32.is_multiple_of(fps) {
        90_000
    } else {
        fps * 1000
    }
}

/// Writes a playable MP4 file (moov before mdat).
#[derive(Debug)]
pub struct Mp4Writer {
    encoder: H264Encoder,
    muxer: Muxer<BufWriter<File>>,
    path: PathBuf,
    fps: u32,
    frames: usize,
}

impl Mp4Writer {
    /// Creates `path` for `width × height` H.264 video at `fps` frames per second.
    pub fn create(path: &Path, width: usize, height: usize, fps: u32) -> Result<Self> {
        let encoder = H264Encoder::new(width, height, fps)?;
        let file = File::create(path).map_err(|e| io(path, e))?;
        // Sizes fit u32: `H264Encoder::new` caps them at 3840.
        let muxer = MuxerBuilder::new(BufWriter::new(file))
            .video(
                VideoCodec::H264,
                width as u32,
                height as u32,
                f64::from(fps),
            )
            .with_fast_start(true)
            .build()
            .map_err(|e| io(path, e))?;
        Ok(Self {
            encoder,
            muxer,
            path: path.to_path_buf(),
            fps,
            frames: 0,
        })
    }

    /// Encodes and appends one RGB frame (`height × width × 3`).
    pub fn write_frame(&mut self, rgb: &[u8]) -> Result<()> {
        let frame = self.encoder.encode(rgb, false)?;
        let pts = self.frames as f64 / f64::from(self.fps);
        self.muxer
            .write_video(pts, &frame.annex_b, frame.keyframe)
            .map_err(|e| io(&self.path, e))?;
        self.frames += 1;
        Ok(())
    }

    /// Frames written.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// Writes the headers and samples (muxide holds them until now) and flushes.
    pub fn finish(mut self) -> Result<usize> {
        if self.frames == 0 {
            // muxide would describe the empty track with a placeholder 640x480 SPS.
            return Err(io(&self.path, "an MP4 needs at least one frame"));
        }
        self.muxer
            .finish_in_place()
            .map_err(|e| io(&self.path, e))?;
        // Flush explicitly: dropping a BufWriter swallows write errors.
        let mut out = self.muxer.into_writer();
        out.flush().map_err(|e| io(&self.path, e))?;
        Ok(self.frames)
    }
}

/// Produces fragmented MP4 in memory: an init segment, then one media fragment (moof+mdat) per call.
#[derive(Debug)]
pub struct FragmentedMp4 {
    encoder: H264Encoder,
    width: usize,
    height: usize,
    fps: u32,
    timescale: u32,
    frames: usize,
    fragments: u32,
}

impl FragmentedMp4 {
    /// Creates a producer for `width × height` H.264 video at `fps` frames per second.
    pub fn new(width: usize, height: usize, fps: u32) -> Result<Self> {
        let encoder = H264Encoder::new(width, height, fps)?;
        Ok(Self {
            encoder,
            width,
            height,
            fps,
            timescale: timescale(fps),
            frames: 0,
            fragments: 0,
        })
    }

    /// Encodes `frames` (each RGB h×w×3) into one fragment; the first call's bytes are
    /// the init segment (ftyp+moov) followed by the first fragment, so a browser's
    /// MediaSource can append every returned buffer in order.
    pub fn fragment(&mut self, frames: &[&[u8]]) -> Result<Vec<u8>> {
        if frames.is_empty() {
            return Err(MediaError::Mux(
                "a fragment needs at least one frame".to_string(),
            ));
        }
        // Check every size first so a bad frame fails before any is encoded.
        for rgb in frames {
            crate::check(self.width, self.height, rgb)?;
        }
        let mut encoded = Vec::with_capacity(frames.len());
        for (i, rgb) in frames.iter().enumerate() {
            encoded.push(self.encoder.encode(rgb, i == 0)?);
        }
        let mut out = Vec::new();
        if self.fragments == 0 {
            out = self.init_segment(&encoded[0])?;
        }
        let samples: Vec<Sample> = encoded
            .iter()
            .map(|f| Sample {
                data: annexb_to_avcc(&f.annex_b),
                sync: f.keyframe,
            })
            .collect();
        let per_frame = self.timescale / self.fps;
        let base_time = self.frames as u64 * u64::from(per_frame);
        out.extend(media_fragment(
            self.fragments + 1,
            base_time,
            per_frame,
            &samples,
        )?);
        // Counted only on success: after a failed call the next one still starts
        // where the stream left off, with a forced IDR.
        self.fragments += 1;
        self.frames += frames.len();
        Ok(out)
    }

    /// Frames encoded into fragments so far.
    pub fn frames(&self) -> usize {
        self.frames
    }

    /// `ftyp` + `moov` for the stream whose first frame is `first` (an IDR with SPS/PPS).
    fn init_segment(&self, first: &EncodedFrame) -> Result<Vec<u8>> {
        let avc = extract_avc_config(&first.annex_b)
            .ok_or_else(|| mux_error("the first IDR frame carries no SPS/PPS"))?;
        let mut config = FragmentConfig::new(self.width as u32, self.height as u32, self.timescale);
        config.sps = avc.sps;
        config.pps = avc.pps;
        let mut muxer = FragmentedMuxer::new(config).map_err(mux_error)?;
        Ok(muxer.init_segment())
    }
}

/// One length-prefixed access unit of a fragment.
struct Sample {
    data: Vec<u8>,
    sync: bool,
}

/// A plain box: 32-bit size, type, payload.
fn mp4_box(kind: &[u8; 4], payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(8 + payload.len());
    out.extend_from_slice(&((8 + payload.len()) as u32).to_be_bytes());
    out.extend_from_slice(kind);
    out.extend_from_slice(payload);
    out
}

/// A full box: a plain box whose payload starts with version and 24-bit flags.
fn full_box(kind: &[u8; 4], version: u8, flags: u32, payload: &[u8]) -> Vec<u8> {
    let mut body = Vec::with_capacity(4 + payload.len());
    body.extend_from_slice(&((u32::from(version) << 24) | (flags & 0xff_ffff)).to_be_bytes());
    body.extend_from_slice(payload);
    mp4_box(kind, &body)
}

/// `moof` + `mdat` for `samples`, the first decoded at `base_time`.
fn media_fragment(
    sequence: u32,
    base_time: u64,
    duration: u32,
    samples: &[Sample],
) -> Result<Vec<u8>> {
    let payload: usize = samples.iter().map(|s| s.data.len()).sum();
    let mdat_size = u32::try_from(8 + payload)
        .map_err(|_| mux_error(format!("a fragment of {payload} bytes exceeds 4 GiB")))?;
    // The offset field has a fixed width, so a probe gives the final moof size.
    let probe = moof(sequence, base_time, duration, samples, 0);
    let data_offset =
        u32::try_from(probe.len() + 8).map_err(|_| mux_error("the moof box exceeds 4 GiB"))?;
    let mut out = moof(sequence, base_time, duration, samples, data_offset);
    out.reserve(mdat_size as usize);
    out.extend_from_slice(&mdat_size.to_be_bytes());
    out.extend_from_slice(b"mdat");
    for sample in samples {
        out.extend_from_slice(&sample.data);
    }
    Ok(out)
}

/// The `moof` of one fragment; sample sizes fit u32 because the `mdat` does.
fn moof(
    sequence: u32,
    base_time: u64,
    duration: u32,
    samples: &[Sample],
    data_offset: u32,
) -> Vec<u8> {
    let mfhd = full_box(b"mfhd", 0, 0, &sequence.to_be_bytes());
    let tfhd = full_box(b"tfhd", 0, DEFAULT_BASE_IS_MOOF, &TRACK_ID.to_be_bytes());
    // Version 1: a 64-bit decode time never wraps, even for days of video.
    let tfdt = full_box(b"tfdt", 1, 0, &base_time.to_be_bytes());
    let mut run = Vec::with_capacity(8 + 12 * samples.len());
    run.extend_from_slice(&(samples.len() as u32).to_be_bytes());
    run.extend_from_slice(&data_offset.to_be_bytes());
    for sample in samples {
        run.extend_from_slice(&duration.to_be_bytes());
        run.extend_from_slice(&(sample.data.len() as u32).to_be_bytes());
        let flags = if sample.sync {
            SYNC_SAMPLE
        } else {
            NON_SYNC_SAMPLE
        };
        run.extend_from_slice(&flags.to_be_bytes());
    }
    let trun = full_box(b"trun", 0, TRUN_FLAGS, &run);
    let traf = mp4_box(b"traf", &[tfhd, tfdt, trun].concat());
    mp4_box(b"moof", &[mfhd, traf].concat())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Cursor;

    const W: usize = 48;
    const H: usize = 32;
    const FPS: u32 = 16;

    /// Frame `i` of a test clip: a gradient whose colours drift with `i`.
    fn clip_frame(i: usize, width: usize, height: usize) -> Vec<u8> {
        let mut rgb = Vec::with_capacity(width * height * 3);
        for y in 0..height {
            for x in 0..width {
                rgb.push((x * 4 + i * 11) as u8);
                rgb.push((y * 6 + i * 5) as u8);
                rgb.push((200 - i * 8) as u8);
            }
        }
        rgb
    }

    fn clip(width: usize, height: usize, frames: std::ops::Range<usize>) -> Vec<Vec<u8>> {
        frames.map(|i| clip_frame(i, width, height)).collect()
    }

    /// Top-level boxes of `buf` as (type, payload); 32-bit sizes only, as written here.
    fn boxes(mut buf: &[u8]) -> Vec<(String, &[u8])> {
        let mut out = Vec::new();
        while !buf.is_empty() {
            let size = u32::from_be_bytes(buf[..4].try_into().unwrap()) as usize;
            assert!(
                size >= 8 && size <= buf.len(),
                "box size {size} out of range"
            );
            out.push((
                String::from_utf8_lossy(&buf[4..8]).into_owned(),
                &buf[8..size],
            ));
            buf = &buf[size..];
        }
        out
    }

    fn kinds(buf: &[u8]) -> Vec<String> {
        boxes(buf).into_iter().map(|(kind, _)| kind).collect()
    }

    /// The payload of the first box at `path` (container types descended into).
    fn find<'a>(buf: &'a [u8], path: &[&str]) -> &'a [u8] {
        let (_, payload) = boxes(buf)
            .into_iter()
            .find(|(kind, _)| kind == path[0])
            .unwrap_or_else(|| panic!("no {} box", path[0]));
        if path.len() == 1 {
            payload
        } else {
            find(payload, &path[1..])
        }
    }

    fn u32_at(buf: &[u8], at: usize) -> u32 {
        u32::from_be_bytes(buf[at..at + 4].try_into().unwrap())
    }

    /// Mean of each RGB channel.
    fn mean(rgb: &[u8]) -> [f64; 3] {
        let mut sum = [0f64; 3];
        for px in rgb.chunks_exact(3) {
            for c in 0..3 {
                sum[c] += f64::from(px[c]);
            }
        }
        sum.map(|s| s / (rgb.len() / 3) as f64)
    }

    /// Decodes length-prefixed samples with OpenH264, starting with only `sps`/`pps`
    /// (what a player takes from `avcC`), and returns the RGB pictures.
    fn decode(sps: &[u8], pps: &[u8], samples: &[&[u8]]) -> Vec<((usize, usize), Vec<u8>)> {
        use openh264::decoder::Decoder;
        use openh264::formats::YUVSource;
        let mut decoder = Decoder::new().unwrap();
        let mut pictures = Vec::new();
        for (i, sample) in samples.iter().enumerate() {
            let mut annex_b = Vec::new();
            if i == 0 {
                for ps in [sps, pps] {
                    annex_b.extend_from_slice(&[0, 0, 0, 1]);
                    annex_b.extend_from_slice(ps);
                }
            }
            let mut rest = *sample;
            while !rest.is_empty() {
                let len = u32_at(rest, 0) as usize;
                annex_b.extend_from_slice(&[0, 0, 0, 1]);
                annex_b.extend_from_slice(&rest[4..4 + len]);
                rest = &rest[4 + len..];
            }
            let yuv = decoder
                .decode(&annex_b)
                .unwrap()
                .expect("a picture per sample");
            let (w, h) = yuv.dimensions();
            let mut rgb = vec![0; w * h * 3];
            yuv.write_rgb8(&mut rgb);
            pictures.push(((w, h), rgb));
        }
        pictures
    }

    #[test]
    fn mp4_of_two_chunks_reads_back_as_one_avc1_track_of_21_frames_at_16_fps() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("clip.mp4");
        let mut writer = Mp4Writer::create(&path, W, H, FPS).unwrap();
        for chunk in [clip(W, H, 0..9), clip(W, H, 9..21)] {
            for frame in &chunk {
                writer.write_frame(frame).unwrap();
            }
        }
        assert_eq!(writer.frames(), 21);
        assert_eq!(writer.finish().unwrap(), 21);

        let bytes = std::fs::read(&path).unwrap();
        assert_eq!(kinds(&bytes), ["ftyp", "moov", "mdat"], "moov before mdat");
        let mut mp4 =
            ::mp4::Mp4Reader::read_header(Cursor::new(&bytes), bytes.len() as u64).unwrap();
        assert_eq!(mp4.tracks().len(), 1);
        let track = mp4.tracks().values().next().unwrap();
        assert_eq!(track.box_type().unwrap().to_string(), "avc1");
        assert_eq!(track.media_type().unwrap(), ::mp4::MediaType::H264);
        assert_eq!((track.width(), track.height()), (W as u16, H as u16));
        assert_eq!(track.sample_count(), 21);
        let timescale = track.timescale();
        assert_eq!(timescale % FPS, 0);
        let per_frame = u64::from(timescale / FPS);
        assert_eq!(track.trak.mdia.mdhd.duration, 21 * per_frame);
        assert_eq!(
            track.duration(),
            std::time::Duration::from_micros(1_312_500)
        );
        let id = track.track_id();
        for n in 1..=21u32 {
            let sample = mp4.read_sample(id, n).unwrap().unwrap();
            assert_eq!(sample.start_time, u64::from(n - 1) * per_frame);
            assert_eq!(u64::from(sample.duration), per_frame);
            if n == 1 {
                assert!(sample.is_sync, "the first sample must be a sync sample");
            }
        }
    }

    #[test]
    fn fragmented_mp4_is_an_init_segment_then_one_idr_led_fragment_per_call() {
        let mut fmp4 = FragmentedMp4::new(W, H, FPS).unwrap();
        let first = clip(W, H, 0..9);
        let second = clip(W, H, 9..21);
        let a = fmp4
            .fragment(&first.iter().map(Vec::as_slice).collect::<Vec<_>>())
            .unwrap();
        let b = fmp4
            .fragment(&second.iter().map(Vec::as_slice).collect::<Vec<_>>())
            .unwrap();
        assert_eq!(fmp4.frames(), 21);
        assert_eq!(kinds(&a), ["ftyp", "moov", "moof", "mdat"]);
        assert_eq!(kinds(&b), ["moof", "mdat"]);

        let stream = [a, b].concat();
        let top = boxes(&stream);
        let mdhd = find(&stream, &["moov", "trak", "mdia", "mdhd"]);
        let timescale = u32_at(mdhd, 12);
        assert_eq!(timescale % FPS, 0);
        let per_frame = timescale / FPS;
        let avc1 = find(&stream, &["moov", "trak", "mdia", "minf", "stbl", "stsd"]);
        assert_eq!(&avc1[12..16], b"avc1");
        assert!(!find(&stream, &["moov", "mvex", "trex"]).is_empty());

        for (k, (count, first_frame)) in [(9u32, 0u64), (12, 9)].into_iter().enumerate() {
            let (moof, mdat) = (top[2 + 2 * k].1, top[3 + 2 * k].1);
            assert_eq!(u32_at(find(moof, &["mfhd"]), 4), k as u32 + 1);
            let tfhd = find(moof, &["traf", "tfhd"]);
            assert_eq!(u32_at(tfhd, 4), TRACK_ID);
            let tfdt = find(moof, &["traf", "tfdt"]);
            assert_eq!(tfdt[0], 1, "64-bit tfdt");
            let base = u64::from_be_bytes(tfdt[4..12].try_into().unwrap());
            assert_eq!(base, first_frame * u64::from(per_frame));
            let trun = find(moof, &["traf", "trun"]);
            assert_eq!(u32_at(trun, 4), count);
            assert_eq!(u32_at(trun, 8) as usize, moof.len() + 8 + 8, "data offset");
            let mut total = 0;
            for s in 0..count as usize {
                let entry = 12 + 12 * s;
                assert_eq!(u32_at(trun, entry), per_frame);
                total += u32_at(trun, entry + 4) as usize;
                let flags = u32_at(trun, entry + 8);
                if s == 0 {
                    assert_eq!(flags, SYNC_SAMPLE, "fragment {k} starts with an IDR");
                }
            }
            assert_eq!(total, mdat.len());
        }

        // The mp4 crate parses the same stream as one fragmented avc1 track.
        let mp4 = ::mp4::Mp4Reader::read_header(Cursor::new(&stream), stream.len() as u64).unwrap();
        assert!(mp4.is_fragmented());
        assert_eq!(mp4.moofs.len(), 2);
        let track = mp4.tracks().values().next().unwrap();
        assert_eq!(track.box_type().unwrap().to_string(), "avc1");
        assert_eq!((track.width(), track.height()), (W as u16, H as u16));
        let counts: Vec<u32> = mp4
            .moofs
            .iter()
            .map(|m| m.trafs[0].trun.as_ref().unwrap().sample_count)
            .collect();
        assert_eq!(counts, [9, 12]);
        let bases: Vec<u64> = mp4
            .moofs
            .iter()
            .map(|m| m.trafs[0].tfdt.as_ref().unwrap().base_media_decode_time)
            .collect();
        assert_eq!(bases, [0, 9 * u64::from(per_frame)]);
    }

    #[test]
    fn a_later_fragment_decodes_alone_with_only_the_init_segment() {
        let mut fmp4 = FragmentedMp4::new(W, H, FPS).unwrap();
        let first = clip(W, H, 0..9);
        let second = clip(W, H, 9..21);
        let init_and_first = fmp4
            .fragment(&first.iter().map(Vec::as_slice).collect::<Vec<_>>())
            .unwrap();
        let later = fmp4
            .fragment(&second.iter().map(Vec::as_slice).collect::<Vec<_>>())
            .unwrap();
        let init_len: usize = boxes(&init_and_first)[..2]
            .iter()
            .map(|(_, p)| p.len() + 8)
            .sum();
        let init = &init_and_first[..init_len];
        let mp4 = ::mp4::Mp4Reader::read_header(Cursor::new(init), init.len() as u64).unwrap();
        let track = mp4.tracks().values().next().unwrap();
        let (sps, pps) = (
            track.sequence_parameter_set().unwrap(),
            track.picture_parameter_set().unwrap(),
        );

        let parts = boxes(&later);
        let (trun, mut mdat) = (find(parts[0].1, &["traf", "trun"]), parts[1].1);
        let mut samples = Vec::new();
        for s in 0..u32_at(trun, 4) as usize {
            let (sample, rest) = mdat.split_at(u32_at(trun, 16 + 12 * s) as usize);
            samples.push(sample);
            mdat = rest;
        }
        let pictures = decode(sps, pps, &samples);
        assert_eq!(pictures.len(), 12);
        for (picture, source) in pictures.iter().zip(&second) {
            assert_eq!(picture.0, (W, H));
            let (got, want) = (mean(&picture.1), mean(source));
            for c in 0..3 {
                assert!((got[c] - want[c]).abs() < 12.0, "{got:?} vs {want:?}");
            }
        }
    }

    #[test]
    fn sizes_that_are_not_multiples_of_16_keep_their_dimensions() {
        let (w, h) = (50, 30);
        let mut fmp4 = FragmentedMp4::new(w, h, 25).unwrap();
        let frames = clip(w, h, 0..3);
        let bytes = fmp4
            .fragment(&frames.iter().map(Vec::as_slice).collect::<Vec<_>>())
            .unwrap();
        let mp4 = ::mp4::Mp4Reader::read_header(Cursor::new(&bytes), bytes.len() as u64).unwrap();
        let track = mp4.tracks().values().next().unwrap();
        assert_eq!((track.width(), track.height()), (50, 30));
        let parts = boxes(&bytes);
        let first_size = u32_at(find(parts[2].1, &["traf", "trun"]), 16) as usize;
        let pictures = decode(
            track.sequence_parameter_set().unwrap(),
            track.picture_parameter_set().unwrap(),
            &[&parts[3].1[..first_size]],
        );
        assert_eq!(pictures[0].0, (w, h), "the SPS crops to the true size");
    }

    #[test]
    fn odd_sizes_and_bad_frames_are_rejected_with_messages_naming_the_size() {
        let dir = tempfile::tempdir().unwrap();
        let err = Mp4Writer::create(&dir.path().join("odd.mp4"), 47, 32, FPS).unwrap_err();
        assert!(err.to_string().contains("47x32"), "{err}");
        assert!(err.to_string().contains("even"), "{err}");
        let err = FragmentedMp4::new(48, 33, FPS).unwrap_err();
        assert!(err.to_string().contains("48x33"), "{err}");
        let err = FragmentedMp4::new(W, H, 0).unwrap_err();
        assert!(err.to_string().contains("0 fps"), "{err}");

        let mut fmp4 = FragmentedMp4::new(W, H, FPS).unwrap();
        let good = clip_frame(0, W, H);
        let err = fmp4.fragment(&[&good, &good[..5]]).unwrap_err();
        assert!(err.to_string().contains("48x32"), "{err}");
        assert!(fmp4.fragment(&[]).is_err());
        let empty = Mp4Writer::create(&dir.path().join("empty.mp4"), W, H, FPS).unwrap();
        assert!(empty
            .finish()
            .unwrap_err()
            .to_string()
            .contains("at least one frame"));
        assert_eq!(fmp4.frames(), 0);
        // After a rejected call the stream still starts with the init segment.
        assert_eq!(
            kinds(&fmp4.fragment(&[&good]).unwrap()),
            ["ftyp", "moov", "moof", "mdat"]
        );
    }
}
