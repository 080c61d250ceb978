// The live page: microphone -> AudioWorklet (16 kHz PCM) -> WebSocket -> partials and finals.
// ?autostart=1 starts at once; ?seconds=N ends the recording after N seconds of audio.
(() => {
  "use strict";
  const params = new URLSearchParams(location.search);
  const status = document.getElementById("status");
  const toggle = document.getElementById("toggle");
  const finals = document.getElementById("finals");
  const partial = document.getElementById("partial");
  const level = document.getElementById("level");
  let session = null;

  function say(text, error = false) {
    status.textContent = text;
    status.className = error ? "error" : "";
  }

  function clock(seconds) {
    const m = Math.floor(seconds / 60);
    return `${m}:${(seconds - 60 * m).toFixed(1).padStart(4, "0")}`;
  }

  function addFinal(message) {
    const line = document.createElement("div");
    line.className = "final";
    const time = document.createElement("span");
    time.className = "time";
    time.textContent = `${clock(message.start)}–${clock(message.end)}`;
    line.appendChild(time);
    const words = message.words && message.words.length ? message.words : null;
    if (words) {
      words.forEach((w, i) => {
        const span = document.createElement("span");
        span.className = "word";
        const sure = w.confidence ?? w.probability;
        if (sure !== undefined && sure < 0.5) span.classList.add("low");
        span.title = `${w.start.toFixed(2)}–${w.end.toFixed(2)} s` +
          (sure !== undefined ? `, confidence ${sure.toFixed(2)}` : "");
        span.textContent = (i ? " " : "") + w.word;
        line.appendChild(span);
      });
    } else {
      line.appendChild(document.createTextNode(message.text));
    }
    finals.appendChild(line);
  }

  async function start() {
    const rate = 16000;
    const media = await navigator.mediaDevices.getUserMedia({
      audio: { channelCount: 1, echoCancellation: false, noiseSuppression: false, autoGainControl: false },
    });
    const context = new AudioContext();
    await context.audioWorklet.addModule("worklet.js");  // relative: under a proxy's prefix too
    const source = context.createMediaStreamSource(media);
    const node = new AudioWorkletNode(context, "pcm-resampler", {
      processorOptions: { targetRate: rate, packetMs: 100 },
    });
    // The socket opens after the audio is set up, with its handlers attached at once.
    const scheme = location.protocol === "https:" ? "wss" : "ws";
    const ws = new WebSocket(`${scheme}://${location.host}${location.pathname}`);  // this page's address
    ws.binaryType = "arraybuffer";
    const s = { ws, media, context, node, sent: 0, ended: false };
    session = s;
    const limit = Number(params.get("seconds") || 0);
    node.port.onmessage = (event) => {
      if (s.ended || ws.readyState !== WebSocket.OPEN || !s.ready) return;
      const pcm = new Int16Array(event.data);
      let peak = 0;
      for (let i = 0; i < pcm.length; i += 8) peak = Math.max(peak, Math.abs(pcm[i]));
      level.style.width = `${Math.min(100, (100 * peak) / 16384)}%`;
      ws.send(event.data);
      s.sent += pcm.length;
      if (limit && s.sent >= limit * rate) stop();
    };
    source.connect(node);
    ws.onopen = () => ws.send(JSON.stringify({ type: "start", sample_rate: rate, format: "s16le" }));
    ws.onmessage = (event) => {
      const message = JSON.parse(event.data);
      if (message.type === "ready") {
        s.ready = true;
        const first = message.first_chunk_ms !== message.chunk_ms
          ? `, each utterance's first ${message.first_chunk_ms} ms` : "";
        say(message.chunk_ms === null ? "Listening (full context: finals only)…"
          : `Listening (chunks of ${message.chunk_ms} ms${first})…`);
      } else if (message.type === "partial") {
        partial.textContent = message.text;
      } else if (message.type === "final") {
        partial.textContent = "";
        addFinal(message);
      } else if (message.type === "done") {
        partial.textContent = "";
        document.body.dataset.done = message.text;
        say(`Done: ${clock(message.duration)} of audio.`);
      } else if (message.type === "error") {
        say(`Error: ${message.message}`, true);
      }
    };
    ws.onerror = () => say("Cannot reach the server.", true);
    ws.onclose = (event) => {
      if (event.code === 1001) say("The server stopped; the finals of what it heard are above.", true);
      if (session === s) finish(s);
    };
    toggle.textContent = "Stop";
    toggle.classList.add("recording");
  }

  function finish(s) {
    s.ended = true;
    s.media.getTracks().forEach((t) => t.stop());
    s.context.close();
    toggle.textContent = "Start";
    toggle.classList.remove("recording");
    level.style.width = "0";
    session = null;
  }

  function stop() {
    const s = session;
    if (!s) return;
    if (s.ws.readyState === WebSocket.OPEN) s.ws.send(JSON.stringify({ type: "end" }));
    finish(s);
  }

  // Without a secure context (http from another machine) the browser hides the microphone.
  if (!window.isSecureContext || !navigator.mediaDevices) {
    say("This browser gives the microphone only to https pages and to localhost: start " +
      "asr serve with --certfile (and --keyfile), or open this page through ssh -L " +
      `${location.port || 80}:localhost:${location.port || 80}.`, true);
    toggle.disabled = true;
    return;
  }
  toggle.addEventListener("click", () => {
    if (session) stop();
    else start().catch((err) => say(`Cannot start: ${err.message}`, true));
  });
  if (params.get("autostart")) start().catch((err) => say(`Cannot start: ${err.message}`, true));
})();
