// streamtts browser page: stream text to /v1/stream, play the audio gaplessly.
//
// Gapless playback: every binary frame (float32 at 24 kHz) becomes an AudioBuffer played by
// its own AudioBufferSourceNode, started at a running `nextStart` time on the AudioContext
// clock, so each chunk begins exactly where the previous one ends. The context runs at 24 kHz
// (the stream's rate): per-buffer resampling by the browser would put seams at chunk edges.
// If a chunk arrives after `nextStart` has passed, that is an underrun: playback restarts
// PREROLL_S ahead of now and the underrun is counted (shown on the page).
"use strict";

const RATE = 24000;
const params = new URLSearchParams(location.search);
// Head start of the first chunk (and after an underrun): a margin for network and generation
// jitter. `?preroll=SECONDS` overrides it.
const PREROLL_S = Number(params.get("preroll")) || 0.1;
const $ = (id) => document.getElementById(id);

// Everything measured, for the page and for automated tests (window.streamtts).
const stats = (window.streamtts = {
  state: "idle", chunks: 0, samples: 0, underruns: 0, gapSeconds: 0,
  schedule: [], segments: [], errors: [], ttfaMs: null, done: null, ready: null, closeCode: null,
});

let ctx = null, ws = null, nextStart = null, firstStart = null, tSend = 0;

function resetStats() {
  Object.assign(stats, {
    state: "connecting", chunks: 0, samples: 0, underruns: 0, gapSeconds: 0,
    schedule: [], segments: [], errors: [], ttfaMs: null, done: null, ready: null, closeCode: null,
  });
  nextStart = null; firstStart = null;
  $("segments").innerHTML = ""; $("log").textContent = "";
  for (const id of ["s-ttfa", "s-sttfa", "s-rtf"]) $(id).textContent = "–";
}

function schedule(pcm) {
  const buf = ctx.createBuffer(1, pcm.length, RATE);
  buf.copyToChannel(pcm, 0);
  const src = ctx.createBufferSource();
  src.buffer = buf;
  src.connect(ctx.destination);
  const now = ctx.currentTime;
  let late = false;
  if (nextStart === null) {
    nextStart = firstStart = now + PREROLL_S;
  } else if (nextStart < now + 0.005) {
    late = true;
    stats.underruns += 1;
    const restart = now + PREROLL_S;
    stats.gapSeconds += restart - nextStart;
    nextStart = restart;
  }
  src.start(nextStart);
  stats.schedule.push({ start: nextStart, samples: pcm.length, late });
  nextStart += pcm.length / RATE;
}

function onBinary(data) {
  const pcm = new Float32Array(data);
  if (stats.ttfaMs === null) {
    stats.ttfaMs = performance.now() - tSend;
    $("s-ttfa").textContent = stats.ttfaMs.toFixed(0) + " ms";
  }
  stats.chunks += 1;
  stats.samples += pcm.length;
  schedule(pcm);
  $("s-audio").textContent = (stats.samples / RATE).toFixed(2) + " s";
  $("s-underruns").textContent = String(stats.underruns);
}

function onMessage(msg) {
  if (msg.type === "ready") {
    stats.ready = msg;
  } else if (msg.type === "segment") {
    stats.segments.push(msg);
    const li = document.createElement("li");
    li.dataset.start = msg.start_s; li.dataset.end = msg.end_s;
    li.textContent = msg.text;
    const small = document.createElement("small");
    small.textContent = `${msg.start_s.toFixed(2)}–${msg.end_s.toFixed(2)} s`;
    li.appendChild(small);
    $("segments").appendChild(li);
  } else if (msg.type === "done") {
    stats.done = msg;
    if (msg.ttfa_ms !== null) $("s-sttfa").textContent = msg.ttfa_ms.toFixed(0) + " ms";
    if (msg.rtf !== null) $("s-rtf").textContent = msg.rtf.toFixed(2);
  } else if (msg.type === "error") {
    stats.errors.push(msg);
    $("log").textContent += `${msg.code}: ${msg.message}\n`;
  }
}

// Highlight the segment being heard, from the audio clock.
function tick() {
  if (ctx && firstStart !== null) {
    const heard = Math.max(0, ctx.currentTime - firstStart - stats.gapSeconds);
    for (const li of $("segments").children) {
      const s = Number(li.dataset.start), e = Number(li.dataset.end);
      li.className = heard >= e ? "spoken" : heard >= s ? "speaking" : "";
    }
    $("s-ahead").textContent = Math.max(0, nextStart - ctx.currentTime).toFixed(2) + " s";
  }
  requestAnimationFrame(tick);
}

function setState(s) {
  stats.state = s;
  $("s-state").textContent = s;
  const busy = s === "connecting" || s === "streaming";
  $("speak").disabled = busy;
  $("stop").disabled = !busy;
}

async function sendWords(text) {
  // Like an LLM: one word (with its trailing space) per message, a few ms apart.
  const words = text.match(/\S+\s*/g) || [];
  for (const w of words) {
    if (!ws || ws.readyState !== WebSocket.OPEN) return;
    ws.send(JSON.stringify({ type: "text", text: w }));
    await new Promise((r) => setTimeout(r, 15));
  }
}

async function speak() {
  if (!ctx) ctx = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" });
  await ctx.resume();
  resetStats();
  setState("connecting");
  const token = $("token").value.trim();
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/stream` +
    (token ? `?token=${encodeURIComponent(token)}` : "");
  ws = new WebSocket(url);
  ws.binaryType = "arraybuffer";
  ws.onopen = async () => {
    setState("streaming");
    const start = { type: "start", format: "pcm_f32le_24000" };
    const voice = $("voice").value.trim();
    const seed = $("seed").value.trim();
    if (voice) start.voice = voice;
    if (seed) start.seed = Number(seed);
    ws.send(JSON.stringify(start));
    const text = $("text").value;
    tSend = performance.now();
    if ($("tokens").checked) await sendWords(text);
    else ws.send(JSON.stringify({ type: "text", text }));
    if (ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "end" }));
  };
  ws.onmessage = (ev) => {
    if (typeof ev.data === "string") onMessage(JSON.parse(ev.data));
    else onBinary(ev.data);
  };
  ws.onclose = (ev) => {
    stats.closeCode = ev.code;
    setState(stats.done ? "done" : `closed (${ev.code}${ev.reason ? ": " + ev.reason : ""})`);
    ws = null;
  };
  ws.onerror = () => { $("log").textContent += "WebSocket error\n"; };
}

$("speak").addEventListener("click", speak);
$("stop").addEventListener("click", () => { if (ws) ws.send(JSON.stringify({ type: "cancel" })); });
const qtoken = params.get("token");
if (qtoken) $("token").value = qtoken;
requestAnimationFrame(tick);
