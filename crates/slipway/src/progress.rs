//! Progress on a terminal: the live lines of `slipway exec` (one per running job, redrawn in
//! place below the scrolling job output) and the spinner line of `slipway image build`.
//!
//! Everything here is pure (text in, text or bytes out) except [`terminal_size`] and the log
//! route ([`LogWriter`]); the callers own the clocks, the redraw tasks and the writes.

use std::os::fd::AsRawFd;
use std::sync::Mutex;
use std::time::{Duration, Instant};

// Elapsed times read as on the status page: `12s`, `1m05s`, `2h03m`.
use slipway_status::format::duration;

/// Where the manager's log lines go while live lines are drawn (`None`: stderr).
type LogRoute = Box<dyn Fn(&[u8]) -> bool + Send>;
static LOG_ROUTE: Mutex<Option<LogRoute>> = Mutex::new(None);

/// Send log lines to `route` instead of stderr (`None`: back to stderr). `route` returns false
/// when it cannot take them (its printer is gone): they go to stderr then.
pub fn route_logs(route: Option<LogRoute>) {
    *LOG_ROUTE.lock().unwrap_or_else(|p| p.into_inner()) = route;
}

/// The log writer of `slipway`'s `tracing` output: stderr, or, while live lines are drawn, the
/// one task that draws them, so a warning neither tears them nor is erased by their redraw.
#[derive(Debug, Default, Clone, Copy)]
pub struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let routed = LOG_ROUTE
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .is_some_and(|route| route(buf));
        if routed {
            Ok(buf.len())
        } else {
            std::io::stderr().write(buf)
        }
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

/// How often live lines and spinners are redrawn.
pub const REDRAW_EVERY: Duration = Duration::from_millis(250);

/// Width assumed when neither the terminal nor `COLUMNS` says.
pub const DEFAULT_WIDTH: usize = 100;

/// Bytes of a job's unfinished output line kept to show (a terminal line is far shorter).
const PARTIAL_MAX: usize = 4096;

/// Spinner frames of a running build step.
const SPINNER: [char; 10] = ['⠋', '⠙', '⠹', '⠸', '⠼', '⠴', '⠦', '⠧', '⠇', '⠏'];

/// The size of the terminal behind `fd` as (columns, rows), `None` when it is not a terminal
/// or does not know its size (a pseudo-terminal nobody sized reports zero columns).
pub fn terminal_size(fd: &impl AsRawFd) -> Option<(usize, usize)> {
    let mut ws = nix::libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    #[allow(unsafe_code)]
    // SAFETY: TIOCGWINSZ writes one `winsize` through the pointer, which points at a live local
    // of that type; the descriptor is borrowed from an open handle for the whole call.
    let r = unsafe { nix::libc::ioctl(fd.as_raw_fd(), nix::libc::TIOCGWINSZ, &mut ws) };
    (r == 0 && ws.ws_col > 0).then_some((usize::from(ws.ws_col), usize::from(ws.ws_row)))
}

/// The width to render for: the terminal's, else `COLUMNS`, else [`DEFAULT_WIDTH`].
pub fn width_of(size: Option<(usize, usize)>, columns_env: Option<&str>) -> usize {
    size.map(|(cols, _)| cols)
        .or_else(|| columns_env.and_then(|c| c.trim().parse().ok()))
        .filter(|w| *w > 0)
        .unwrap_or(DEFAULT_WIDTH)
}

/// How many live lines fit: half the terminal's rows, so the job output above stays visible
/// (10 when the height is unknown).
pub fn max_lines_of(size: Option<(usize, usize)>) -> usize {
    match size {
        Some((_, rows)) if rows > 0 => (rows / 2).max(1),
        _ => 10,
    }
}

/// The running jobs of `slipway exec`, each with the last line of output it printed.
#[derive(Debug, Default)]
pub struct LiveLines {
    /// In the order they started.
    jobs: Vec<LiveJob>,
}

#[derive(Debug)]
struct LiveJob {
    name: String,
    stage: String,
    started: Instant,
    /// The last complete line with something visible, cleaned.
    last: String,
    /// Output after the last newline (a prompt, a progress bar redrawn with `\r`).
    partial: Vec<u8>,
}

impl LiveJob {
    fn push_partial(&mut self, bytes: &[u8]) {
        self.partial.extend_from_slice(bytes);
        if self.partial.len() > PARTIAL_MAX {
            // A progress bar redraws itself after `\r`: only what follows the last one shows.
            if let Some(cr) = self.partial.iter().rposition(|b| *b == b'\r') {
                self.partial.drain(..=cr);
            }
            // Still long: the start of the line is what a terminal shows first anyway.
            self.partial.truncate(PARTIAL_MAX);
        }
    }

    /// What the job shows now: its unfinished line if that shows something, else its last line.
    fn shown(&self) -> String {
        let partial = visible(&self.partial);
        if partial.is_empty() {
            self.last.clone()
        } else {
            partial
        }
    }
}

impl LiveLines {
    /// No jobs.
    pub fn new() -> Self {
        Self::default()
    }

    /// A job started at `now` (a job of the same name is replaced).
    pub fn add(&mut self, name: &str, stage: &str, now: Instant) {
        self.remove(name);
        self.jobs.push(LiveJob {
            name: name.to_string(),
            stage: stage.to_string(),
            started: now,
            last: String::new(),
            partial: Vec::new(),
        });
    }

    /// A chunk of a job's (already masked) output; unknown jobs are ignored.
    pub fn output(&mut self, name: &str, bytes: &[u8]) {
        let Some(job) = self.jobs.iter_mut().find(|j| j.name == name) else {
            return;
        };
        let Some(end) = bytes.iter().rposition(|b| *b == b'\n') else {
            job.push_partial(bytes);
            return;
        };
        // Complete lines, newest first; the oldest one begins with the kept partial line.
        let lines: Vec<&[u8]> = bytes[..end].split(|b| *b == b'\n').collect();
        for (i, line) in lines.iter().enumerate().rev() {
            let text = if i == 0 {
                let mut whole = std::mem::take(&mut job.partial);
                whole.extend_from_slice(line);
                visible(bounded(&whole))
            } else {
                visible(bounded(line))
            };
            if !text.is_empty() {
                job.last = text;
                break;
            }
        }
        job.partial.clear();
        job.push_partial(&bytes[end + 1..]);
    }

    /// A job ended.
    pub fn remove(&mut self, name: &str) {
        self.jobs.retain(|j| j.name != name);
    }

    /// Number of running jobs.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.jobs.len()
    }

    /// Whether no job runs.
    #[cfg(test)]
    pub fn is_empty(&self) -> bool {
        self.jobs.is_empty()
    }

    /// The line a job shows as its last output (cleaned), if it runs.
    #[cfg(test)]
    pub fn last_line(&self, name: &str) -> Option<String> {
        self.jobs
            .iter()
            .find(|j| j.name == name)
            .map(LiveJob::shown)
    }

    /// One line per job (`» test › unit  1m05s  last output`), each narrower than `width`
    /// columns, at most `max_lines` (the last one then counts the jobs left out). No escapes.
    pub fn render(&self, now: Instant, width: usize, max_lines: usize) -> Vec<String> {
        // One column spare: a line filling the last column makes some terminals wrap.
        let room = width.saturating_sub(1).max(1);
        let max_lines = max_lines.max(1);
        let shown = if self.jobs.len() > max_lines {
            max_lines - 1
        } else {
            self.jobs.len()
        };
        let mut out: Vec<String> = self.jobs[..shown]
            .iter()
            .map(|j| {
                let elapsed = duration(now.saturating_duration_since(j.started).as_secs_f64());
                let head = format!(
                    "» {} › {}  {elapsed}",
                    visible(j.stage.as_bytes()),
                    visible(j.name.as_bytes())
                );
                let last = j.shown();
                let line = if last.is_empty() {
                    head
                } else {
                    format!("{head}  {last}")
                };
                truncate(&line, room)
            })
            .collect();
        if shown < self.jobs.len() {
            let more = self.jobs.len() - shown;
            out.push(truncate(
                &format!(
                    "» … and {more} more job{} running",
                    if more == 1 { "" } else { "s" }
                ),
                room,
            ));
        }
        out
    }
}

/// A line longer than what is kept: what follows its last `\r` (what a terminal would show),
/// cut to [`PARTIAL_MAX`] bytes.
fn bounded(line: &[u8]) -> &[u8] {
    if line.len() <= PARTIAL_MAX {
        return line;
    }
    let from = line
        .iter()
        .rposition(|b| *b == b'\r')
        .map(|cr| cr + 1)
        .unwrap_or(0);
    let rest = &line[from..];
    &rest[..rest.len().min(PARTIAL_MAX)]
}

/// What one line of output shows on a terminal, as plain text: escape sequences (colours,
/// cursor moves, titles) and control characters removed, `\r` and erase-line applied the way a
/// terminal would (so `10%\r20%` shows `20%`), surrounding blanks trimmed.
pub fn visible(line: &[u8]) -> String {
    let text = String::from_utf8_lossy(line);
    let mut cells: Vec<char> = Vec::new();
    let mut col = 0usize;
    let mut chars = text.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\u{1b}' => match chars.next() {
                // CSI: parameters, then one final byte in @..~.
                Some('[') => {
                    let mut params = String::new();
                    for p in chars.by_ref() {
                        if ('@'..='~').contains(&p) {
                            if p == 'K' {
                                erase_in_line(&mut cells, col, &params);
                            }
                            break;
                        }
                        params.push(p);
                    }
                }
                // OSC, DCS, SOS, PM, APC: a string ended by BEL or ESC \.
                Some(']' | 'P' | 'X' | '^' | '_') => {
                    while let Some(s) = chars.next() {
                        if s == '\u{7}' {
                            break;
                        }
                        if s == '\u{1b}' {
                            if chars.peek() == Some(&'\\') {
                                chars.next();
                            }
                            break;
                        }
                    }
                }
                // Two-character escapes (charset, keypad modes): nothing to show.
                _ => {}
            },
            '\r' => col = 0,
            '\u{8}' => col = col.saturating_sub(1),
            '\t' => put(&mut cells, &mut col, ' '),
            c if c.is_control() => {}
            c => put(&mut cells, &mut col, c),
        }
    }
    let s: String = cells.into_iter().collect();
    s.trim().to_string()
}

fn put(cells: &mut Vec<char>, col: &mut usize, c: char) {
    if *col < cells.len() {
        cells[*col] = c;
    } else {
        cells.resize(*col, ' ');
        cells.push(c);
    }
    *col += 1;
}

/// `ESC [ n K`: 0 (or none) erases from the cursor to the end, 1 to the start, 2 the line.
fn erase_in_line(cells: &mut Vec<char>, col: usize, params: &str) {
    match params {
        "" | "0" => cells.truncate(col),
        "1" => {
            let end = (col + 1).min(cells.len());
            cells[..end].iter_mut().for_each(|c| *c = ' ');
        }
        "2" => cells.iter_mut().for_each(|c| *c = ' '),
        _ => {}
    }
}

/// Columns a character takes on a terminal. Wide (East Asian, emoji) ranges count two; a
/// character counted wider than it is only cuts a line a little early, never makes it wrap.
fn char_width(c: char) -> usize {
    let u = u32::from(c);
    let wide = matches!(u,
        0x1100..=0x115F
        | 0x231A..=0x23FF
        | 0x2600..=0x27BF
        | 0x2E80..=0x303E
        | 0x3041..=0x33FF
        | 0x3400..=0x4DBF
        | 0x4E00..=0x9FFF
        | 0xA000..=0xA4CF
        | 0xAC00..=0xD7A3
        | 0xF900..=0xFAFF
        | 0xFE30..=0xFE4F
        | 0xFF00..=0xFF60
        | 0xFFE0..=0xFFE6
        | 0x1F000..=0x1FAFF
        | 0x20000..=0x3FFFD);
    if wide { 2 } else { 1 }
}

/// Columns a string takes on a terminal (see [`char_width`]).
pub fn text_width(s: &str) -> usize {
    s.chars().map(char_width).sum()
}

/// `s` cut to at most `max` columns, the cut marked with `…`.
pub fn truncate(s: &str, max: usize) -> String {
    if text_width(s) <= max {
        return s.to_string();
    }
    let mut out = String::new();
    let mut used = 0;
    for c in s.chars() {
        let w = char_width(c);
        // Room for the ellipsis.
        if used + w + 1 > max {
            break;
        }
        out.push(c);
        used += w;
    }
    if max > 0 {
        out.push('…');
    }
    out
}

/// The live lines' place on the terminal: what is drawn at the bottom, and the bytes that
/// print output above it, redraw it or clear it. When the output is not a terminal (`live`
/// false) it draws nothing and passes output through unchanged: no escape sequences at all.
#[derive(Debug)]
pub struct Screen {
    live: bool,
    drawn: Vec<String>,
}

impl Screen {
    /// A screen drawing live lines (on a terminal) or not.
    pub fn new(live: bool) -> Self {
        Screen {
            live,
            drawn: Vec::new(),
        }
    }

    /// Whether live lines are drawn.
    #[cfg(test)]
    pub fn is_live(&self) -> bool {
        self.live
    }

    /// Bytes that print `text` (whole lines) above the live lines, then draw `lines` below it.
    pub fn print(&mut self, text: &[u8], lines: &[String]) -> Vec<u8> {
        if !self.live {
            return text.to_vec();
        }
        if text.is_empty() {
            return self.redraw(lines);
        }
        let mut out = self.clear();
        out.extend_from_slice(&in_place(text));
        out.extend_from_slice(&self.draw(lines));
        out
    }

    /// Bytes that replace the live lines with `lines` (none when they are unchanged).
    pub fn redraw(&mut self, lines: &[String]) -> Vec<u8> {
        if !self.live || self.drawn == lines {
            return Vec::new();
        }
        let mut out = self.clear();
        out.extend_from_slice(&self.draw(lines));
        out
    }

    /// Bytes that erase the live lines, leaving the cursor where the first one was.
    pub fn clear(&mut self) -> Vec<u8> {
        if !self.live || self.drawn.is_empty() {
            return Vec::new();
        }
        let n = self.drawn.len();
        self.drawn.clear();
        // Each drawn line ended with a newline: up that many lines, then erase to the end.
        format!("\r\x1b[{n}A\x1b[J").into_bytes()
    }

    fn draw(&mut self, lines: &[String]) -> Vec<u8> {
        let mut out = Vec::new();
        for l in lines {
            out.extend_from_slice(l.as_bytes());
            // Erase what a longer line drawn there before may have left.
            out.extend_from_slice(b"\x1b[K\n");
        }
        self.drawn = lines.to_vec();
        out
    }
}

/// `text` without the escape sequences that move the cursor or erase beyond the line (a job's
/// `docker pull` progress, say): above the live lines they would break the count of lines to
/// redraw. Colours (`ESC [ … m`) and erasing within a line (`ESC [ … K`) stay.
pub fn in_place(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i] != 0x1b {
            out.push(text[i]);
            i += 1;
            continue;
        }
        match text.get(i + 1) {
            Some(b'[') => {
                // Parameters and intermediates, then one final byte in 0x40..=0x7e.
                let end = text[i + 2..]
                    .iter()
                    .position(|b| (0x40..=0x7e).contains(b))
                    .map(|p| i + 2 + p);
                match end {
                    Some(e) => {
                        if matches!(text[e], b'm' | b'K') {
                            out.extend_from_slice(&text[i..=e]);
                        }
                        i = e + 1;
                    }
                    None => i = text.len(),
                }
            }
            // Other escapes (save/restore cursor, titles' OSC and the like): the escape and its
            // next byte go; an OSC's text stays visible, which is harmless.
            Some(_) => i += 2,
            None => i += 1,
        }
    }
    out
}

/// The line of a running build step on a terminal: `[2/8] debootstrap … ⠹ 12s`, narrower than
/// `width` (the step's text is cut, the spinner and time kept).
pub fn step_line(head: &str, elapsed: Duration, frame: usize, width: usize) -> String {
    let tail = format!(
        " {} {}",
        SPINNER[frame % SPINNER.len()],
        duration(elapsed.as_secs_f64())
    );
    let room = width
        .saturating_sub(1)
        .saturating_sub(text_width(&tail))
        .max(1);
    format!("{}{tail}", truncate(head, room))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at(base: Instant, secs: u64) -> Instant {
        base + Duration::from_secs(secs)
    }

    #[test]
    fn a_line_shows_stage_name_elapsed_and_last_output() {
        let t0 = Instant::now();
        let mut l = LiveLines::new();
        l.add("unit", "test", t0);
        assert_eq!(l.render(at(t0, 3), 100, 10), ["» test › unit  3s"]);
        l.output("unit", b"$ cargo test\nCompiling foo v0.1.0\n");
        assert_eq!(
            l.render(at(t0, 65), 100, 10),
            ["» test › unit  1m05s  Compiling foo v0.1.0"]
        );
        // Blank lines keep the last line that showed something.
        l.output("unit", b"\n   \n");
        assert_eq!(l.last_line("unit").as_deref(), Some("Compiling foo v0.1.0"));
        l.add("lint", "test", at(t0, 1));
        l.output("lint", b"checking");
        let lines = l.render(at(t0, 7262), 100, 10);
        assert_eq!(
            lines,
            [
                "» test › unit  2h01m  Compiling foo v0.1.0",
                "» test › lint  2h01m  checking",
            ]
        );
        l.remove("unit");
        assert_eq!(l.len(), 1);
        l.remove("lint");
        assert!(l.is_empty());
        assert!(l.render(t0, 100, 10).is_empty());
    }

    #[test]
    fn output_in_pieces_and_partial_lines() {
        let t0 = Instant::now();
        let mut l = LiveLines::new();
        l.add("j", "s", t0);
        l.output("j", b"hel");
        assert_eq!(l.last_line("j").as_deref(), Some("hel"));
        l.output("j", b"lo wor");
        l.output("j", b"ld\nnext");
        assert_eq!(l.last_line("j").as_deref(), Some("next"));
        l.output("j", b"\n");
        assert_eq!(l.last_line("j").as_deref(), Some("next"));
        // A progress bar redrawn with `\r` shows its newest state.
        l.output("j", b"10%\r20%\r30%");
        assert_eq!(l.last_line("j").as_deref(), Some("30%"));
        l.output("j", b"\rdone       \n");
        assert_eq!(l.last_line("j").as_deref(), Some("done"));
        // Output of a job not shown (already ended) changes nothing.
        l.output("gone", b"x\n");
        assert_eq!(l.len(), 1);
        // A huge unfinished line is kept bounded.
        l.output("j", &vec![b'x'; 3 * PARTIAL_MAX]);
        assert!(l.jobs[0].partial.len() <= PARTIAL_MAX);
    }

    #[test]
    fn escapes_and_control_characters_never_reach_the_line() {
        assert_eq!(visible(b"\x1b[1;32mok\x1b[0m done"), "ok done");
        assert_eq!(visible(b"\x1b]0;title\x07shown"), "shown");
        assert_eq!(visible(b"\x1b]8;;http://x\x1b\\link\x1b]8;;\x1b\\"), "link");
        assert_eq!(visible(b"a\tb\x07c\x00d"), "a bcd");
        assert_eq!(visible(b"abc\x08\x08X"), "aXc");
        // GitLab's section markers erase themselves.
        assert_eq!(
            visible(b"section_start:1700000000:build\r\x1b[0KBuilding"),
            "Building"
        );
        assert_eq!(visible(b"section_end:1700000000:build\r\x1b[0K"), "");
        assert_eq!(visible(b"old text\r\x1b[2Knew"), "new");
        assert_eq!(
            visible("naïve ✓ \u{1b}[31mрусский".as_bytes()),
            "naïve ✓ русский"
        );

        let t0 = Instant::now();
        let mut l = LiveLines::new();
        l.add("j\x1b[31m", "s", t0);
        l.output("j\x1b[31m", b"\x1b[31mred\x1b[0m\n");
        let line = l.render(t0, 100, 10).concat();
        assert!(!line.contains('\u{1b}'), "{line:?}");
        assert!(!line.chars().any(|c| c.is_control()), "{line:?}");
        assert_eq!(line, "» s › j  0s  red");
    }

    #[test]
    fn lines_fit_the_width() {
        let t0 = Instant::now();
        let mut l = LiveLines::new();
        l.add("build", "compile", t0);
        l.output("build", format!("{}\n", "y".repeat(300)).as_bytes());
        for width in [1, 2, 10, 20, 40, 80, 100, 200] {
            let lines = l.render(t0, width, 10);
            assert_eq!(lines.len(), 1);
            let w = text_width(&lines[0]);
            assert!(w < width.max(2), "width {width}: {w} {:?}", lines[0]);
        }
        // 40 columns: 39 used, the last one by the ellipsis.
        let lines = l.render(t0, 40, 10);
        assert_eq!(
            lines[0],
            format!("» compile › build  0s  {}…", "y".repeat(15))
        );
        assert_eq!(text_width(&lines[0]), 39);
        // Wide characters count two columns.
        l.output("build", "日本語のテキスト日本語のテキスト\n".as_bytes());
        let lines = l.render(t0, 30, 10);
        assert!(text_width(&lines[0]) < 30, "{:?}", lines[0]);
        assert!(lines[0].ends_with('…'), "{:?}", lines[0]);

        assert_eq!(truncate("abcdef", 6), "abcdef");
        assert_eq!(truncate("abcdef", 5), "abcd…");
        assert_eq!(truncate("日本語", 5), "日本…");
        assert_eq!(truncate("abc", 0), "");
    }

    #[test]
    fn too_many_jobs_end_with_a_count() {
        let t0 = Instant::now();
        let mut l = LiveLines::new();
        for i in 0..5 {
            l.add(&format!("job{i}"), "test", t0);
        }
        let lines = l.render(t0, 100, 3);
        assert_eq!(
            lines,
            [
                "» test › job0  0s",
                "» test › job1  0s",
                "» … and 3 more jobs running",
            ]
        );
        assert_eq!(l.render(t0, 100, 5).len(), 5);
        assert_eq!(l.render(t0, 100, 4)[3], "» … and 2 more jobs running");
    }

    #[test]
    fn width_and_height_sources() {
        assert_eq!(width_of(Some((132, 40)), Some("80")), 132);
        assert_eq!(width_of(None, Some("80")), 80);
        assert_eq!(width_of(None, Some(" 90 ")), 90);
        assert_eq!(width_of(None, Some("wide")), DEFAULT_WIDTH);
        assert_eq!(width_of(None, Some("0")), DEFAULT_WIDTH);
        assert_eq!(width_of(None, None), DEFAULT_WIDTH);
        assert_eq!(max_lines_of(Some((80, 24))), 12);
        assert_eq!(max_lines_of(Some((80, 1))), 1);
        assert_eq!(max_lines_of(Some((80, 0))), 10);
        assert_eq!(max_lines_of(None), 10);
        // A file is no terminal.
        let f = tempfile::tempfile().expect("tempfile");
        assert_eq!(terminal_size(&f), None);
    }

    #[test]
    fn redraw_clears_then_draws_in_place() {
        let mut s = Screen::new(true);
        let one = vec!["» a › x  1s".to_string()];
        let two = vec!["» a › x  2s".to_string(), "» a › y  0s".to_string()];
        // Nothing drawn yet: nothing to clear.
        assert_eq!(s.clear(), b"");
        assert_eq!(s.redraw(&one), b"\xc2\xbb a \xe2\x80\xba x  1s\x1b[K\n");
        // Unchanged lines are not redrawn.
        assert_eq!(s.redraw(&one), b"");
        let out = String::from_utf8(s.redraw(&two)).expect("utf-8");
        assert_eq!(out, "\r\x1b[1A\x1b[J» a › x  2s\x1b[K\n» a › y  0s\x1b[K\n");
        // Output goes above the live lines: clear them, print, draw them again.
        let out = String::from_utf8(s.print(b"[x] hello\n", &two)).expect("utf-8");
        assert_eq!(
            out,
            "\r\x1b[2A\x1b[J[x] hello\n» a › x  2s\x1b[K\n» a › y  0s\x1b[K\n"
        );
        // No output and unchanged lines: nothing to write.
        assert_eq!(s.print(b"", &two), b"");
        // The last job ended: the lines go, and stay gone.
        assert_eq!(s.redraw(&[]), b"\r\x1b[2A\x1b[J");
        assert_eq!(s.clear(), b"");
        s.redraw(&one);
        assert_eq!(s.clear(), b"\r\x1b[1A\x1b[J");
        assert_eq!(s.clear(), b"");
    }

    #[test]
    fn output_above_live_lines_keeps_colours_but_not_cursor_moves() {
        let text = b"\x1b[32mok\x1b[0m\n\x1b[1A\x1b[2Jpull 50%\x1b[K\x1b7x\n";
        assert_eq!(
            in_place(text),
            b"\x1b[32mok\x1b[0m\npull 50%\x1b[Kx\n".to_vec()
        );
        assert_eq!(in_place(b"cut \x1b[12"), b"cut ".to_vec());
        let mut screen = Screen::new(true);
        let out = screen.print(b"\x1b[3Aup\n", &["» live".to_string()]);
        assert!(!out.windows(4).any(|w| w == b"\x1b[3A"), "{out:?}");
    }

    #[test]
    fn log_lines_take_the_route_while_one_is_set() {
        use std::io::Write as _;
        let seen = std::sync::Arc::new(Mutex::new(Vec::<u8>::new()));
        let sink = seen.clone();
        route_logs(Some(Box::new(move |b: &[u8]| {
            sink.lock().unwrap().extend_from_slice(b);
            true
        })));
        LogWriter.write_all(b"WARN heartbeat failed\n").unwrap();
        route_logs(None);
        assert_eq!(&*seen.lock().unwrap(), b"WARN heartbeat failed\n");
        // A route that cannot take them hands them back (to stderr).
        route_logs(Some(Box::new(|_: &[u8]| false)));
        assert_eq!(LogWriter.write(b"x\n").unwrap(), 2);
        route_logs(None);
    }

    #[test]
    fn no_escapes_when_not_a_terminal() {
        let mut s = Screen::new(false);
        assert!(!s.is_live());
        let lines = vec!["» a › x  1s".to_string()];
        assert_eq!(s.redraw(&lines), b"");
        assert_eq!(s.print(b"[x] hello\n", &lines), b"[x] hello\n");
        assert_eq!(s.print(b"", &lines), b"");
        assert_eq!(s.clear(), b"");
    }

    #[test]
    fn step_lines_keep_spinner_and_time() {
        let head = "[2/8] debootstrap bookworm from http://deb.debian.org/debian (takes minutes) …";
        let line = step_line(head, Duration::from_secs(12), 2, 200);
        assert_eq!(line, format!("{head} ⠹ 12s"));
        assert_eq!(
            step_line(head, Duration::ZERO, 11, 200),
            format!("{head} ⠙ 0s")
        );
        let narrow = step_line(head, Duration::from_secs(75), 0, 40);
        assert!(text_width(&narrow) < 40, "{narrow:?}");
        assert!(narrow.starts_with("[2/8] debootstrap"), "{narrow:?}");
        assert!(narrow.ends_with("… ⠋ 1m15s"), "{narrow:?}");
        assert!(!narrow.contains('\u{1b}'));
    }
}
