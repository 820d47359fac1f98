// streamtts browser page: stream text to /v1/stream, play the audio gaplessly.
//
// Gapless playback: every binary frame (float32 at 24 kHz) becomes an AudioBuffer played by
// its own AudioBufferSourceNode, started at a running `nextStart` time on the AudioContext
// clock, so each chunk begins exactly where the previous one ends. The context runs at 24 kHz
// (the stream's rate): per-buffer resampling by the browser would put seams at chunk edges.
// If a chunk arrives after `nextStart` has passed, that is an underrun: playback restarts
// PREROLL_S ahead of now and the underrun is counted (shown on the page).
//
// A run's sources all go through one GainNode (`run.out`). Stop mutes it and stops every
// source at once, including those scheduled seconds ahead; a new Speak stops the previous run
// first, so runs never overlap. The state is "playing" from the server's `done` until the
// last scheduled sample has been heard, then "done". A start the server refuses (an `error`
// before `ready`) ends the run: the page sends no text and is ready for the next Speak.
//
// The output is metered by an AudioWorklet (static/meter.js) on the context's own clock:
// `window.streamtts.meter` holds when sound last started and stopped, so a test can measure
// how long Stop took to silence the output.
"use strict";

const RATE = 24000;
const params = new URLSearchParams(location.search);
// Head start of the first chunk (and after an underrun): a margin for network and generation
// jitter. `?preroll=SECONDS` overrides it.
const PREROLL_S = Number(params.get("preroll")) || 0.1;
const $ = (id) => document.getElementById(id);

function freshStats() {
  return {
    state: "idle", run: 0, chunks: 0, samples: 0, underruns: 0, gapSeconds: 0,
    schedule: [], segments: [], errors: [], ttfaMs: null, done: null, ready: null, closeCode: null,
    refused: null, stoppedAt: null, replacedAt: null, playbackEnd: null,
  };
}

// Everything measured, for the page and for automated tests (window.streamtts).
const stats = (window.streamtts = Object.assign(freshStats(), {
  info: null, upload: null, voices: 0, meter: { ready: false, sound: false, soundSince: null, silentSince: null },
}));

let ctx = null, meterNode = null, run = null;

async function audio() {
  if (!ctx) {
    ctx = new AudioContext({ sampleRate: RATE, latencyHint: "interactive" });
    await startMeter();
  }
  await ctx.resume();
  return ctx;
}

async function startMeter() {
  // An AudioWorklet needs a secure context (https, or localhost); the page plays without it.
  if (!ctx.audioWorklet) return;
  try {
    await ctx.audioWorklet.addModule("/static/meter.js");
    meterNode = new AudioWorkletNode(ctx, "streamtts-meter", { numberOfOutputs: 0 });
    meterNode.port.onmessage = (ev) => {
      const m = stats.meter;
      m.sound = ev.data.sound;
      if (ev.data.sound) m.soundSince = ev.data.t; else m.silentSince = ev.data.t;
    };
    stats.meter.ready = true;
  } catch (err) {
    console.warn("no output meter:", err);
  }
}

function resetStats(runId) {
  const keep = { info: stats.info, upload: stats.upload, meter: stats.meter };
  Object.assign(stats, freshStats(), keep, { run: runId });
  $("segments").innerHTML = "";
  $("log").textContent = "";
  for (const id of ["s-ttfa", "s-sttfa", "s-rtf"]) $(id).textContent = "–";
  $("s-audio").textContent = "0.00 s";
  $("s-ahead").textContent = "0.00 s";
  $("s-underruns").textContent = "0";
}

function setState(s) {
  stats.state = s;
  $("s-state").textContent = s;
  const live = s === "connecting" || s === "streaming" || s === "playing";
  $("speak").disabled = s === "connecting";
  $("stop").disabled = !live;
}

function logLine(text) {
  $("log").textContent += text + "\n";
}

// -- one run: a WebSocket session and the sources it scheduled ---------------------------------
function newRun() {
  const out = ctx.createGain();
  out.connect(ctx.destination);
  if (meterNode) out.connect(meterNode);
  return { id: (run ? run.id : 0) + 1, ws: null, out, sources: new Set(), nextStart: null,
           firstStart: null, tSend: 0, over: false, endTimer: null };
}

function silence(r) {
  // Mute first (takes effect at the next render quantum), then stop every source, even those
  // scheduled seconds ahead: nothing of this run plays after this.
  r.out.gain.setValueAtTime(0, ctx.currentTime);
  for (const src of r.sources) {
    try { src.stop(); } catch (e) { /* not started yet in some engines: disconnecting is enough */ }
    src.disconnect();
  }
  r.sources.clear();
  r.out.disconnect();
  clearTimeout(r.endTimer);
}

function endRun(r, state) {
  if (r.over) return;
  r.over = true;
  if (r.ws && r.ws.readyState <= WebSocket.OPEN) r.ws.close(1000);
  if (r === run) setState(state);
}

function stop() {
  if (!run || run.over) return;
  stats.stoppedAt = ctx.currentTime;
  if (run.ws && run.ws.readyState === WebSocket.OPEN) run.ws.send(JSON.stringify({ type: "cancel" }));
  silence(run);
  endRun(run, "stopped");
}

function schedule(r, pcm) {
  const buf = ctx.createBuffer(1, pcm.length, RATE);
  buf.copyToChannel(pcm, 0);
  const src = ctx.createBufferSource();
  src.buffer = buf;
  src.connect(r.out);
  src.onended = () => r.sources.delete(src);
  const now = ctx.currentTime;
  let late = false;
  if (r.nextStart === null) {
    r.nextStart = r.firstStart = now + PREROLL_S;
  } else if (r.nextStart < now + 0.005) {
    late = true;
    stats.underruns += 1;
    const restart = now + PREROLL_S;
    stats.gapSeconds += restart - r.nextStart;
    r.nextStart = restart;
  }
  src.start(r.nextStart);
  r.sources.add(src);
  stats.schedule.push({ start: r.nextStart, samples: pcm.length, late });
  r.nextStart += pcm.length / RATE;
}

function onBinary(r, data) {
  const pcm = new Float32Array(data);
  if (stats.ttfaMs === null) {
    stats.ttfaMs = performance.now() - r.tSend;
    $("s-ttfa").textContent = stats.ttfaMs.toFixed(0) + " ms";
  }
  stats.chunks += 1;
  stats.samples += pcm.length;
  schedule(r, pcm);
  $("s-audio").textContent = (stats.samples / RATE).toFixed(2) + " s";
  $("s-underruns").textContent = String(stats.underruns);
}

function waitForPlaybackEnd(r) {
  // "done" only once the last scheduled sample has been heard.
  if (r.over || r !== run) return;
  const left = r.nextStart === null ? 0 : r.nextStart - ctx.currentTime;
  if (left > 0) {
    r.endTimer = setTimeout(() => waitForPlaybackEnd(r), Math.min(left * 1000 + 20, 250));
    return;
  }
  stats.playbackEnd = ctx.currentTime;
  endRun(r, "done");
}

function onMessage(r, msg) {
  if (msg.type === "ready") {
    stats.ready = msg;
    setState("streaming");
    sendText(r);
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
    if (msg.reason === "end") {
      setState("playing");
      waitForPlaybackEnd(r);
    }
  } else if (msg.type === "error") {
    stats.errors.push(msg);
    logLine(`${msg.code}: ${msg.message}`);
    if (stats.ready === null) {
      // The server refused the start (unknown voice, bad option): final for this run.
      stats.refused = msg;
      silence(r);
      endRun(r, `refused (${msg.code})`);
    } else if (msg.fatal) {
      endRun(r, `error (${msg.code})`);
    }
  }
}

async function sendText(r) {
  const ws = r.ws;
  const text = $("text").value;
  r.tSend = performance.now();
  if ($("tokens").checked) {
    // Like an LLM: one word (with its trailing space) per message, a few ms apart.
    for (const w of text.match(/\S+\s*/g) || []) {
      if (r.over || ws.readyState !== WebSocket.OPEN) return;
      ws.send(JSON.stringify({ type: "text", text: w }));
      await new Promise((res) => setTimeout(res, 15));
    }
  } else {
    ws.send(JSON.stringify({ type: "text", text }));
  }
  if (!r.over && ws.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: "end" }));
}

function startMessage() {
  const start = { type: "start", format: "pcm_f32le_24000" };
  const voice = $("voice").value.trim();
  const seed = $("seed").value.trim();
  const model = $("speaker-model").value;
  if (voice) start.voice = voice;
  if (seed) start.seed = Number(seed);
  if (model) start.model = model;
  return start;
}

async function speak() {
  let replacedAt = null; // when a run still playing was silenced for this one (its audio clock)
  if (run && !run.over) { replacedAt = ctx.currentTime; silence(run); endRun(run, "stopped"); }  // never two runs at once
  else if (run) silence(run);
  await audio();
  const r = (run = newRun());
  resetStats(r.id);
  stats.replacedAt = replacedAt;
  setState("connecting");
  const token = $("token").value.trim();
  const url = `${location.protocol === "https:" ? "wss" : "ws"}://${location.host}/v1/stream` +
    (token ? `?token=${encodeURIComponent(token)}` : "");
  const ws = (r.ws = new WebSocket(url));
  ws.binaryType = "arraybuffer";
  // Text goes out only after `ready`: a refused start must not be followed by text.
  ws.onopen = () => ws.send(JSON.stringify(startMessage()));
  ws.onmessage = (ev) => {
    if (r !== run) return;
    if (typeof ev.data === "string") onMessage(r, JSON.parse(ev.data));
    else if (!r.over) onBinary(r, ev.data);
  };
  ws.onclose = (ev) => {
    if (r !== run) return;
    stats.closeCode = ev.code;
    if (r.over) return;
    if (stats.done && stats.done.reason === "end") return;  // playing out what is scheduled
    endRun(r, `closed (${ev.code}${ev.reason ? ": " + ev.reason : ""})`);
  };
  ws.onerror = () => logLine("WebSocket error");
}

// Highlight the segment being heard, from the audio clock.
function tick() {
  if (ctx && run && run.firstStart !== null) {
    const heard = Math.max(0, ctx.currentTime - run.firstStart - stats.gapSeconds);
    for (const li of $("segments").children) {
      const s = Number(li.dataset.start), e = Number(li.dataset.end);
      li.className = heard >= e ? "spoken" : heard >= s ? "speaking" : "";
    }
    const ahead = run.over ? 0 : Math.max(0, run.nextStart - ctx.currentTime);
    $("s-ahead").textContent = ahead.toFixed(2) + " s";
  }
  requestAnimationFrame(tick);
}

// -- voices: drop or choose a clip, get an id -------------------------------------------------
async function upload(file) {
  const token = $("token").value.trim();
  const headers = { "Content-Type": file.type || "application/octet-stream" };
  if (token) headers.Authorization = `Bearer ${token}`;
  stats.upload = { state: "uploading", name: file.name };
  $("upload-status").textContent = `uploading ${file.name}…`;
  try {
    const resp = await fetch(`/v1/voices?name=${encodeURIComponent(file.name)}`,
                             { method: "POST", body: file, headers });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error ? body.error.message : `HTTP ${resp.status}`);
    stats.upload = { state: "done", name: file.name, ...body };
    $("voice").value = body.voice_id;
    loadVoices();
    $("upload-status").textContent =
      `voice ${body.voice_id} (${body.seconds.toFixed(1)} s${body.cached ? ", known" : ""}): in use`;
  } catch (err) {
    stats.upload = { state: "error", name: file.name, error: String(err.message || err) };
    $("upload-status").textContent = `upload failed: ${stats.upload.error}`;
  }
}

// -- voices: designed from a description (the server's MOSS-VoiceGenerator) -----------------------
async function design() {
  const token = $("token").value.trim();
  const headers = { "Content-Type": "application/json" };
  if (token) headers.Authorization = `Bearer ${token}`;
  const description = $("design-text").value.trim();
  const name = $("design-name").value.trim();
  stats.design = { state: "designing", description };
  $("design-status").textContent = "designing…";
  $("design").disabled = true;
  try {
    const resp = await fetch("/v1/voices/design",
                             { method: "POST", headers, body: JSON.stringify({ description, name }) });
    const body = await resp.json();
    if (!resp.ok) throw new Error(body.error ? body.error.message : `HTTP ${resp.status}`);
    stats.design = { state: "done", ...body };
    $("voice").value = body.name || body.voice_id;
    loadVoices();
    $("design-status").textContent = `voice ${body.name || body.voice_id} (${body.seconds.toFixed(1)} s): in use`;
  } catch (err) {
    stats.design = { state: "error", error: String(err.message || err) };
    $("design-status").textContent = `design failed: ${stats.design.error}`;
  } finally {
    $("design").disabled = false;
  }
}

// -- voices: the server's list, offered by the voice field --------------------------------------
async function loadVoices() {
  const token = $("token").value.trim();
  const headers = token ? { Authorization: `Bearer ${token}` } : {};
  try {
    const resp = await fetch("/v1/audio/voices", { headers });
    if (!resp.ok) return;  // 401 until the token is given: the field still takes an id
    const list = $("voice-list");
    list.replaceChildren();
    for (const v of (await resp.json()).voices) {
      const opt = document.createElement("option");
      const stored = v.kind === "uploaded" || v.kind === "designed";
      opt.value = stored && v.name ? v.name : v.id;
      opt.label = v.kind === "uploaded"
        ? `${v.name || v.id}: uploaded, ${v.seconds.toFixed(1)} s`
        : v.kind === "designed"
          ? `${v.name || v.id}: designed (${v.description}), ${v.seconds.toFixed(1)} s`
          : `${v.id}: ${v.description || "a configured voice"}`;
      list.appendChild(opt);
    }
    stats.voices = list.children.length;
  } catch (err) {
    // the server is not up yet: loadInfo retries, and loads the voices once it is
  }
}

function setupUpload() {
  const zone = $("drop");
  $("clip").addEventListener("change", (ev) => { if (ev.target.files[0]) upload(ev.target.files[0]); });
  zone.addEventListener("dragover", (ev) => { ev.preventDefault(); zone.classList.add("over"); });
  zone.addEventListener("dragleave", () => zone.classList.remove("over"));
  zone.addEventListener("drop", (ev) => {
    ev.preventDefault();
    zone.classList.remove("over");
    if (ev.dataTransfer.files[0]) upload(ev.dataTransfer.files[0]);
  });
}

// -- what the server runs -------------------------------------------------------------------
async function loadInfo() {
  try {
    const info = await (await fetch("/v1/info")).json();
    if (!info.ready) { setTimeout(loadInfo, 1000); return; }
    stats.info = info;
    loadVoices();
    $("model").textContent = info.model;
    // voices are designed by a MOSS-VoiceGenerator: the box shows where the server has one
    const models = info.models || [];
    $("design-row").hidden = !models.some((m) => m.model_kind === "moss-voice-generator");
    // several models: the page picks which one speaks (the first is the server's default)
    const pick = $("speaker-model");
    pick.replaceChildren(...models.map((m) => new Option(`${m.id} (${m.model_kind})`, m.id)));
    $("speaker-row").hidden = models.length < 2;
    if (info.notice) {
      $("notice").textContent = info.notice;
      $("notice").hidden = false;
    }
  } catch (err) {
    setTimeout(loadInfo, 2000);
  }
}

$("speak").addEventListener("click", speak);
$("design").addEventListener("click", design);
$("stop").addEventListener("click", stop);
const qtoken = params.get("token");
if (qtoken) $("token").value = qtoken;
$("token").addEventListener("change", loadVoices);
setupUpload();
loadInfo();
requestAnimationFrame(tick);
