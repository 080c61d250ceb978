// The explorer page: draws the JSON in #explorer-data; every data string goes in as text.
"use strict";
(() => {
  const $ = (selector) => document.querySelector(selector);
  const SVG_NS = "http://www.w3.org/2000/svg";
  const collator = new Intl.Collator(undefined, { numeric: true, sensitivity: "base" });

  // Data may miss any key or hold null anywhere: read it only through these.
  const list = (x) => (Array.isArray(x) ? x : []);
  const num = (x) => (typeof x === "number" && Number.isFinite(x) ? x : null);
  const text = (x) => (x == null ? "" : String(x));
  const obj = (x) => (x && typeof x === "object" && !Array.isArray(x) ? x : {});
  const fixed = (x, digits) => (num(x) === null ? "–" : x.toFixed(digits));
  const clock = (x) => { // m:ss.s, rounded before the minutes are split off (1:00.0)
    const tenths = Math.round(x * 10);
    return `${Math.floor(tenths / 600)}:${((tenths % 600) / 10).toFixed(1).padStart(4, "0")}`;
  };
  const count = (x) => (num(x) === null ? "–" : String(x));
  const clamp = (x, lo, hi) => Math.min(hi, Math.max(lo, x));

  function el(tag, attrs, ...children) {
    const node = document.createElement(tag);
    for (const [key, value] of Object.entries(attrs || {})) {
      if (value == null || value === false) continue;
      if (key === "class") node.className = value;
      else node.setAttribute(key, value === true ? "" : String(value));
    }
    for (const child of children) if (child != null) node.append(child); // strings become text nodes
    return node;
  }

  function svg(tag, attrs, ...children) {
    const node = document.createElementNS(SVG_NS, tag);
    for (const [key, value] of Object.entries(attrs || {})) node.setAttribute(key, String(value));
    for (const child of children) node.append(child);
    return node;
  }

  // A failure in one part is reported (console and page) and the rest still renders.
  function guard(what, fn) {
    try {
      return fn();
    } catch (err) {
      console.error(`explorer: ${what}:`, err);
      addNote(`${what} failed: ${err && err.message}`);
      return undefined;
    }
  }

  function readData() {
    try {
      return obj(JSON.parse($("#explorer-data").textContent));
    } catch (err) {
      return { notes: [`the page's data could not be read: ${err.message}`] };
    }
  }

  function addNote(message) {
    $("#notes").append(el("li", { dir: "auto" }, text(message)));
    $("#notice").hidden = false;
  }

  // ---- colour maps: 256 RGB triples interpolated between a few stops ----
  function colormap(stops) {
    const lut = new Uint8ClampedArray(256 * 3);
    for (let v = 0; v < 256; v++) {
      const pos = (v / 255) * (stops.length - 1);
      const i = Math.min(Math.floor(pos), stops.length - 2);
      const f = pos - i;
      for (let c = 0; c < 3; c++) lut[3 * v + c] = stops[i][c] + f * (stops[i + 1][c] - stops[i][c]);
    }
    return lut;
  }
  const VIRIDIS = colormap([[68, 1, 84], [59, 82, 139], [33, 145, 140], [94, 201, 98], [253, 231, 37]]);
  const BLUES = colormap([[247, 251, 255], [158, 202, 225], [49, 130, 189], [8, 48, 107]]);

  // ---- overview ----
  const pct = (x) => (num(x) === null ? "–" : `${x.toFixed(2)} %`);
  const signed = (x, digits) => `${x > 0 ? "+" : ""}${x.toFixed(digits)}`; // a difference
  const cards = (pairs) => pairs.map(([label, value]) => el("div", { class: "card" },
    el("span", { class: "label" }, label), el("span", { class: "value" }, value)));

  function renderSummary(summary) {
    if (!summary || typeof summary !== "object") return;
    $("#summary").replaceChildren(...cards([
      ["WER", pct(summary.wer)], ["CER", pct(summary.cer)],
      ["Sub", count(summary.substitutions)], ["Del", count(summary.deletions)],
      ["Ins", count(summary.insertions)], ["Ref words", count(summary.reference_words)],
      ["Utterances", count(summary.utterances)], ["Sentence errors", count(summary.sentence_errors)],
    ]));
    $("#summary").hidden = false;
  }

  // B: another decode of the same utterances beside this one (asr explore --compare).
  let compared = null;

  function renderCompare(compare) {
    if (!compare || typeof compare !== "object") return;
    compared = compare;
    const summary = obj(compare.summary);
    const diff = num(compare.wer_difference);
    const shared = num(compare.shared);
    const [low = null, high = null] = list(compare.interval).map(num); // none: no shared words
    const interval = low !== null && high !== null ? ` [${signed(low, 2)}, ${signed(high, 2)}]` : "";
    $("#summary-b").replaceChildren(...cards([
      ["B", text(compare.title)], ["WER B", pct(summary.wer)], ["CER B", pct(summary.cer)],
      [shared === null ? "WER B − A (95 %)" : `WER B − A over the ${count(shared)} shared (95 %)`,
        diff === null ? "–" : `${signed(diff, 2)}${interval}`],
      ["Fewer errors in B", count(compare.fewer_errors)], ["More in B", count(compare.more_errors)],
      ["Same", count(compare.same_errors)],
    ]));
    $("#summary-b").hidden = false;
    $("#summary").prepend(...cards([["A", text(compare.title_a)]]));
    $("#summary").hidden = false;
  }

  function sdi(u) {
    const e = obj(u.errors);
    if (!u.errors || typeof u.errors !== "object") return "–";
    return `${count(e.sub)}/${count(e.del)}/${count(e.ins)}`;
  }

  function errorTotal(u) {
    const e = u.errors;
    if (!e || typeof e !== "object") return null;
    return (num(e.sub) || 0) + (num(e.del) || 0) + (num(e.ins) || 0);
  }

  // words said against a reference of none: no rate, but worse than any (sorted as such)
  const wordRate = (s) => (num(s.wer) !== null ? s.wer : errorTotal(s) > 0 ? Infinity : null);
  const rateText = (x) => (x === null ? "–" : x === Infinity ? "∞" : `${fixed(x, 1)} %`);

  function refWordCount(u) {
    const ops = list(u.ops);
    if (ops.length) return ops.filter((op) => list(op)[0] !== "I").length;
    if (Array.isArray(u.ref_words)) return u.ref_words.length;
    return text(u.ref).split(/\s+/).filter(Boolean).length;
  }

  function renderSpeakers(utts) {
    const stats = new Map();
    for (const u of utts) {
      const key = u.speaker == null ? "" : String(u.speaker);
      const s = stats.get(key) || { n: 0, duration: 0, words: 0, errors: 0, scored: 0 };
      s.n += 1;
      s.duration += num(u.duration) || 0;
      const errors = errorTotal(u);
      if (errors !== null) {
        s.errors += errors;
        s.words += refWordCount(u);
        s.scored += 1;
      }
      stats.set(key, s);
    }
    if (!stats.size) return;
    const rows = [...stats.entries()].sort((a, b) => collator.compare(a[0], b[0])).map(([name, s]) => {
      const wer = !s.scored ? null : s.words ? (100 * s.errors) / s.words : s.errors ? Infinity : null;
      return el("tr", {},
        el("td", { dir: "auto", class: name ? null : "na" }, name || "(none)"),
        el("td", { class: "num" }, String(s.n)), el("td", { class: "num" }, s.duration.toFixed(1)),
        el("td", { class: "num" }, s.scored ? String(s.words) : "–"),
        el("td", { class: "num" }, s.scored ? String(s.errors) : "–"),
        el("td", { class: "num" }, wer === Infinity ? "∞" : fixed(wer, 2)));
    });
    $("#speakers tbody").replaceChildren(...rows);
    $("#speakers-box").hidden = false;
  }

  // Sort direction on a header's first click: the worst utterances first.
  const COLUMNS = [
    { key: "id", label: "id", first: 1 },
    { key: "speaker", label: "speaker", first: 1 },
    { key: "duration", label: "dur (s)", first: -1, num: true },
    { key: "wer", label: "WER %", first: -1, num: true },
    { key: "wer_b", label: "WER B %", first: -1, num: true, compare: true },
    { key: "delta", label: "B − A", first: -1, num: true, compare: true },
    { key: "errors", label: "S/D/I", first: -1, num: true },
    { key: "confidence", label: "conf", first: 1, num: true },
    { key: "flags", label: "flags", first: -1 },
  ];
  const table = { columns: [], rows: [], visible: [], key: null, dir: 1, order: null, selected: null };

  function makeRow(u, index) {
    const id = text(u.id);
    const speaker = u.speaker == null ? null : text(u.speaker);
    const flags = list(u.flags).map(text);
    const confidence = num(u.confidence);
    const b = obj(u.compare);
    const keys = {
      id, speaker, duration: num(u.duration), wer: wordRate(u), errors: errorTotal(u),
      confidence, flags: flags.length ? flags.join(", ") : null, wer_b: wordRate(b),
    };
    const delta = keys.wer !== null && keys.wer_b !== null ? keys.wer_b - keys.wer : null;
    keys.delta = Number.isNaN(delta) ? null : delta;
    const shown = (x, digits, show) => (x === Infinity ? "∞" : x === -Infinity ? "−∞" : show(x, digits));
    const td = (value, cls, attrs) => el("td", { class: cls, ...attrs }, value);
    const cells = {
      id: td(id, "id", { dir: "auto", title: id }),
      speaker: td(speaker === null ? "–" : speaker, speaker === null ? "na" : null, { dir: "auto" }),
      duration: td(fixed(keys.duration, 2), "num"),
      wer: td(shown(keys.wer, 1, fixed), "num"),
      wer_b: td(shown(keys.wer_b, 1, fixed), "num"),
      delta: td(keys.delta === null ? "–" : shown(keys.delta, 1, signed),
        keys.delta > 0 ? "num worse" : keys.delta < 0 ? "num better" : "num"),
      errors: td(sdi(u), "num"),
      confidence: td(fixed(confidence, 2), confidence !== null && confidence < 0.5 ? "num low" : "num"),
      flags: td(keys.flags || "", null, { dir: "auto" }),
    };
    const tr = el("tr", { "data-id": id, "data-index": index, tabindex: 0 },
      ...table.columns.map((c) => cells[c.key]));
    const haystack = [id, text(speaker), text(u.ref), text(u.hyp), text(b.hyp)].join("\n").toLowerCase();
    return { u, index, tr, keys, haystack };
  }

  function compareBy(key, dir) {
    return (a, b) => {
      const x = a.keys[key];
      const y = b.keys[key];
      if (x === null || y === null) return x === y ? a.index - b.index : x === null ? 1 : -1; // nulls last
      const c = typeof x === "number" ? x - y : collator.compare(x, y);
      return c ? c * dir : a.index - b.index;
    };
  }

  function renderTable() {
    const terms = $("#filter").value.toLowerCase().split(/\s+/).filter(Boolean);
    const rows = terms.length
      ? table.rows.filter((r) => terms.every((t) => r.haystack.includes(t)))
      : table.rows.slice();
    if (table.key) rows.sort(compareBy(table.key, table.dir));
    const order = `${table.key} ${table.dir}`;
    const shown = new Set(table.visible);
    if (order === table.order && rows.every((r) => shown.has(r))) {
      // A narrower filter in the same order: removing rows costs far less than re-inserting all.
      const keep = new Set(rows);
      for (const r of table.visible) if (!keep.has(r)) r.tr.remove();
    } else {
      const fragment = document.createDocumentFragment();
      for (const r of rows) fragment.append(r.tr);
      $("#utterances tbody").replaceChildren(fragment);
    }
    table.visible = rows;
    table.order = order;
    $("#count").textContent = terms.length
      ? `${rows.length} of ${table.rows.length}` : `${table.rows.length} utterances`;
    updateSteps();
  }

  // ◀ and ▶ step through the rows as the table shows them now (sorted, filtered).
  function updateSteps() {
    const index = table.visible.indexOf(view.row);
    $("#prev").disabled = index <= 0;
    $("#next").disabled = index < 0 || index >= table.visible.length - 1;
  }

  function sortBy(key) {
    const column = table.columns.find((c) => c.key === key);
    if (!column) return;
    table.dir = table.key === key ? -table.dir : column.first;
    table.key = key;
    for (const th of document.querySelectorAll("#utterances th")) {
      const sorted = th.dataset.key === key;
      th.setAttribute("aria-sort", sorted ? (table.dir > 0 ? "ascending" : "descending") : "none");
    }
    renderTable();
  }

  function buildTable(utts) {
    table.columns = COLUMNS.filter((c) => !c.compare || compared);
    $("#utterances").classList.toggle("compared", !!compared);
    $("#utterances thead tr").replaceChildren(...table.columns.map((c) => el("th",
      { "data-key": c.key, class: c.num ? "num" : null, tabindex: 0, "aria-sort": "none" }, c.label)));
    table.rows = utts.map(makeRow);
    $("#empty").hidden = utts.length > 0;
    $("#utterances").hidden = utts.length === 0;
    $("#filter").disabled = utts.length === 0;
    renderTable();
  }

  // ---- the utterance view ----
  const player = $("#player");
  const view = {
    row: null, u: null, seq: 0, duration: 1, arrays: {}, attn: null, words: [], current: null,
    time: 0, raf: 0, hasAudio: false, offset: 0, bounded: false, rowHeight: 14, loading: false,
  };
  const blobs = new Map(); // utterance index -> Promise<ArrayBuffer>, the few last opened

  function axisDuration(u) {
    if (num(u.duration) > 0) return u.duration;
    const ends = list(u.words).map((w) => num(obj(w).end)).filter((x) => x !== null);
    return Math.max(1e-3, ...ends);
  }

  async function inflate(base64) {
    if (typeof DecompressionStream !== "function") throw new Error("this browser has no DecompressionStream");
    const binary = atob(base64);
    const bytes = new Uint8Array(binary.length);
    for (let i = 0; i < binary.length; i++) bytes[i] = binary.charCodeAt(i);
    const stream = new Blob([bytes]).stream().pipeThrough(new DecompressionStream("deflate"));
    return new Response(stream).arrayBuffer();
  }

  function loadBlob(row) {
    if (typeof row.u.blob !== "string" || !row.u.blob) return Promise.resolve(null);
    if (!blobs.has(row.index)) {
      if (blobs.size >= 16) blobs.delete(blobs.keys().next().value);
      let blob = row.u.blob;
      if (blob.startsWith("#")) { // kept in an element of its own, outside the page's JSON
        const node = document.getElementById(blob.slice(1));
        blob = node ? node.textContent : "";
      }
      blobs.set(row.index, inflate(blob));
    }
    return blobs.get(row.index);
  }

  function arrayView(buffer, spec) {
    const shape = list(spec.shape);
    const offset = spec.offset;
    if (!shape.length || !shape.every((n) => Number.isInteger(n) && n >= 0)) return null;
    if (!Number.isInteger(offset) || offset < 0) return null;
    const n = shape.reduce((a, b) => a * b, 1);
    if (spec.dtype === "uint8") {
      if (offset + n > buffer.byteLength) return null;
      return { ...spec, shape, data: new Uint8Array(buffer, offset, n) };
    }
    if (spec.dtype === "int16") {
      if (offset + 2 * n > buffer.byteLength) return null;
      const bytes = new DataView(buffer, offset, 2 * n); // DataView: any alignment, little-endian
      const data = new Int16Array(n);
      for (let i = 0; i < n; i++) data[i] = bytes.getInt16(2 * i, true);
      return { ...spec, shape, data };
    }
    return null;
  }

  // A picture file as the browser decodes it: an ImageBitmap where it can, else an image element.
  async function decodePicture(file) {
    if (typeof createImageBitmap === "function") {
      try {
        return await createImageBitmap(file, { colorSpaceConversion: "none", premultiplyAlpha: "none" });
      } catch (err) {
        // options or call refused by this browser: the image element below tells a bad file
      }
    }
    const url = URL.createObjectURL(file);
    try {
      const image = new Image();
      image.src = url;
      await image.decode();
      return image;
    } finally {
      URL.revokeObjectURL(url);
    }
  }

  // A picture (a spectrogram, stored as WebP): its grey levels, as the browser decodes them.
  async function pictureView(buffer, spec) {
    const shape = list(spec.shape);
    const { offset, bytes } = spec;
    if (shape.length !== 2 || !shape.every((n) => Number.isInteger(n) && n > 0)) return null;
    if (!Number.isInteger(offset) || !Number.isInteger(bytes) || offset < 0) return null;
    if (offset + bytes > buffer.byteLength) return null;
    const [rows, columns] = shape;
    const file = new Blob([new Uint8Array(buffer, offset, bytes)], { type: "image/webp" });
    const picture = await decodePicture(file);
    const width = picture.naturalWidth || picture.width;
    const height = picture.naturalHeight || picture.height;
    let data = null;
    if (width === columns && height === rows) {
      const canvas = document.createElement("canvas");
      canvas.width = columns;
      canvas.height = rows;
      const ctx = canvas.getContext("2d", { willReadFrequently: true });
      ctx.drawImage(picture, 0, 0);
      const px = ctx.getImageData(0, 0, columns, rows).data;
      data = new Uint8Array(rows * columns);
      for (let i = 0; i < data.length; i++) data[i] = px[4 * i + 1]; // grey: R = G = B
    }
    if (typeof picture.close === "function") picture.close(); // an ImageBitmap's memory, now
    return data && { ...spec, shape, data };
  }

  // The arrays of `u` in its inflated blob, and what went wrong with any of them in `notes`.
  async function readArrays(u, buffer, notes) {
    const arrays = {};
    const specs = Object.entries(obj(u.arrays));
    if (!buffer) {
      if (specs.length) notes.push("arrays are listed but no blob holds them");
      return arrays;
    }
    for (const [name, value] of specs) {
      const spec = obj(value);
      if (spec.encoding != null && spec.encoding !== "webp") {
        notes.push(`array "${name}" is kept as ${text(spec.encoding)}, which this page cannot read`);
        continue;
      }
      let a = null;
      try {
        a = spec.encoding === "webp" ? await pictureView(buffer, spec) : arrayView(buffer, spec);
      } catch (err) {
        notes.push(`array "${name}" could not be decoded: ${err && err.message}`);
        continue;
      }
      if (a) arrays[name] = a;
      else notes.push(`array "${name}" does not fit the blob`);
    }
    return arrays;
  }

  function uttNote(message) {
    $("#utt-notes").append(el("li", { dir: "auto" }, text(message)));
    $("#utt-notes").hidden = false;
  }

  async function openUtterance(row) {
    const seq = ++view.seq;
    const panel = $("#utterance");
    panel.removeAttribute("data-ready");
    panel.hidden = false;
    if (panel.getBoundingClientRect().top > window.innerHeight - 80) panel.scrollIntoView(); // out of sight
    if (table.selected) table.selected.tr.classList.remove("selected");
    row.tr.classList.add("selected");
    Object.assign(view, { row, u: row.u, duration: axisDuration(row.u), arrays: {}, attn: null, time: 0 });
    $("#utt-notes").replaceChildren();
    $("#utt-notes").hidden = true;
    const u = row.u;
    table.selected = row;
    guard("utterance details", () => renderDetails(u));
    guard("audio", () => setAudio(u));
    guard("words", () => renderWords(u));
    guard("hypothesis B", () => renderHypB(u));
    guard("n-best", () => renderNbest(u));
    view.loading = typeof u.blob === "string" && u.blob !== "";
    guard("timeline", () => drawTimeline()); // empty tracks until the arrays arrive
    const notes = [];
    let arrays = {};
    try {
      arrays = await readArrays(u, await loadBlob(row), notes);
    } catch (err) {
      notes.push(`the arrays could not be inflated: ${err && err.message}`);
    }
    if (seq !== view.seq) return; // another utterance opened meanwhile
    notes.forEach(uttNote);
    view.loading = false;
    view.arrays = arrays;
    guard("attention", () => setupAttention(u));
    guard("timeline", () => drawTimeline());
    panel.dataset.ready = "1";
  }

  function renderDetails(u) {
    $("#utt-title").textContent = text(u.id);
    const items = [
      ["speaker", u.speaker == null ? "–" : text(u.speaker)],
      ["duration", `${fixed(num(u.duration), 2)} s`],
      ...(num(u.start) === null ? [] : [["from", clock(u.start)]]), // a segment of a recording
      ["WER", rateText(wordRate(u))],
      ["S/D/I", sdi(u)],
      ["confidence", fixed(num(u.confidence), 2)],
    ];
    $("#utt-meta").replaceChildren(...items.map(([k, v]) =>
      el("div", {}, el("dt", {}, k), el("dd", { dir: "auto" }, v))));
    $("#utt-flags").replaceChildren(...list(u.flags).map((f) => el("li", { dir: "auto" }, text(f))));
    updateSteps();
  }

  function setAudio(u) {
    player.pause();
    const src = typeof u.audio === "string" && u.audio ? u.audio : null;
    view.hasAudio = src !== null;
    view.offset = Math.max(0, num(u.audio_offset) || 0); // a linked file's clock runs from its start
    // a linked file may hold more than this utterance (a long recording's segments, the first
    // at offset 0): playback stops at the utterance's end; an embedded clip ends by itself
    const linked = src !== null && !src.startsWith("data:");
    view.bounded = view.offset > 0 || (linked && num(u.duration) > 0);
    const note = $("#audio-note");
    if (src) {
      player.src = src;
      note.hidden = true;
    } else {
      player.removeAttribute("src");
      player.load();
      note.textContent = text(u.audio_note) || "no audio saved";
      note.hidden = false;
    }
    player.hidden = !src;
    $("#play").disabled = !src;
    $("#play").textContent = "play";
  }

  function confColor(conf) {
    return `hsl(${Math.round(120 * clamp(conf, 0, 1))} 75% 42%)`;
  }

  // No dir on words: their container's dir="auto" must see their text (dir'd children are skipped).
  function wordSpan(word, start, end, cls) {
    const span = el("span", { class: cls }, word);
    if (start !== null) span.dataset.start = String(start);
    if (end !== null) span.dataset.end = String(end);
    return span;
  }

  function spaced(nodes) {
    const out = [];
    nodes.forEach((node, i) => out.push(...(i ? [" ", node] : [node])));
    return out;
  }

  // A hypothesis's alignment with its reference: [kind, reference index, hypothesis index].
  const editOps = (x) => list(x).map(list).filter((op) => ["C", "S", "D", "I"].includes(op[0]));

  function renderWords(u) {
    const timed = list(u.words).map((w) => ({
      w: text(obj(w).w), start: num(obj(w).start), end: num(obj(w).end), conf: num(obj(w).conf),
    }));
    // Hypothesis: timed word spans, or the plain text split when no words were saved.
    const words = timed.length ? timed
      : text(u.hyp).split(/\s+/).filter(Boolean).map((w) => ({ w, start: null, end: null, conf: null }));
    const ops = editOps(u.ops);
    const hypOp = new Array(words.length).fill(null);
    for (const [kind, , h] of ops) if (Number.isInteger(h) && h >= 0 && h < words.length) hypOp[h] = kind;

    view.words = words.map((w, i) => {
      const cls = ["word", hypOp[i] ? `op-${hypOp[i].toLowerCase()}` : null, w.conf !== null ? "conf" : null];
      const span = wordSpan(w.w, w.start, w.end, cls.filter(Boolean).join(" "));
      if (w.conf !== null) span.style.setProperty("--conf", confColor(w.conf));
      const times = w.start !== null ? `${w.start.toFixed(2)}–${fixed(w.end, 2)} s` : "no time";
      span.title = w.conf !== null ? `${times}, confidence ${w.conf.toFixed(2)}` : times;
      return { node: span, start: w.start, end: w.end };
    });
    view.current = null;
    $("#hyp").replaceChildren(...(view.words.length
      ? spaced(view.words.map((w) => w.node)) : [el("span", { class: "na" }, "empty hypothesis")]));

    // Reference: its own times, else the time of the hypothesis word aligned to it.
    const refWords = Array.isArray(u.ref_words)
      ? u.ref_words.map((w) => ({ w: text(obj(w).w), start: num(obj(w).start), end: num(obj(w).end) }))
      : text(u.ref).split(/\s+/).filter(Boolean).map((w) => ({ w, start: null, end: null }));
    const refOps = [];
    let lastEnd = null;
    for (const [kind, , h] of ops) {
      const hw = Number.isInteger(h) ? words[h] : undefined;
      if (hw && hw.end !== null) lastEnd = hw.end;
      if (kind !== "I") refOps.push({ kind, start: hw ? hw.start : lastEnd, end: hw ? hw.end : lastEnd });
    }
    const refNodes = refWords.map((w, j) => {
      const op = refOps[j] || {};
      const cls = ["word", op.kind ? `op-${op.kind.toLowerCase()}` : null].filter(Boolean).join(" ");
      const start = w.start !== null ? w.start : num(op.start);
      return wordSpan(w.w, start, w.end !== null ? w.end : num(op.end), cls);
    });
    const noRef = u.ref == null ? "no reference" : "empty reference";
    $("#ref").replaceChildren(...(refNodes.length ? spaced(refNodes) : [el("span", { class: "na" }, noRef)]));

    const pairs = ops.map(([kind, r, h]) => {
      const hw = Number.isInteger(h) ? words[h] : undefined;
      const pair = el("span", { class: `pair op-${kind.toLowerCase()}` },
        el("span", { class: "r" }, r == null ? "·" : text(r)),
        el("span", { class: "h" }, hw ? hw.w : "·"));
      if (hw && hw.start !== null) pair.dataset.start = String(hw.start);
      return pair;
    });
    const none = u.ref == null ? "no alignment (no reference)"
      : "nothing to align: the reference and the hypothesis are empty";
    $("#alignment").replaceChildren(...(pairs.length ? pairs : [el("span", { class: "na" }, none)]));
  }

  // B's hypothesis, its words coloured by their alignment with the reference, the reference
  // words it deletes struck through in their place.
  function renderHypB(u) {
    $("#hyp-b-box").hidden = !compared;
    if (!compared) return;
    const b = u.compare && typeof u.compare === "object" ? u.compare : null;
    $("#hyp-b-title").textContent = `Hypothesis B (${text(compared.title)})` +
      (b && wordRate(b) !== null ? `: WER ${rateText(wordRate(b))}` : "");
    if (!b) {
      $("#hyp-b").replaceChildren(el("span", { class: "na" }, "not in decode B"));
      return;
    }
    const words = text(b.hyp).split(/\s+/).filter(Boolean);
    const ops = editOps(b.ops);
    const nodes = ops.length
      ? ops.map(([kind, r, h]) => el("span", { class: `word op-${kind.toLowerCase()}` },
        kind === "D" ? text(r) : text(words[h])))
      : words.map((w) => el("span", { class: "word" }, w));
    $("#hyp-b").replaceChildren(...(nodes.length
      ? spaced(nodes) : [el("span", { class: "na" }, "empty hypothesis")]));
  }

  function renderNbest(u) {
    const items = list(u.nbest).map((h, i) => el("li", { class: i === 0 ? "best" : null },
      el("span", { dir: "auto" }, text(obj(h).text)),
      el("span", { class: "score" }, num(obj(h).score) === null ? "" : obj(h).score.toFixed(3))));
    $("#nbest").replaceChildren(...items);
    $("#nbest").hidden = items.length === 0;
    $("#nbest-none").hidden = items.length > 0;
  }

  // ---- playback: one time drives the cursor and the current word ----
  function seek(t) {
    if (view.hasAudio) {
      player.currentTime = view.offset + t;
      player.play().catch(() => {}); // playback refused (policy, codec): the seek still stands
    } else {
      setTime(t);
    }
  }

  function setTime(t) {
    view.time = t;
    $("#cursor").style.left = `${(100 * clamp(t / view.duration, 0, 1)).toFixed(3)}%`;
    let found = null;
    for (const w of view.words) {
      if (w.start !== null && w.end !== null && w.start <= t && t < w.end) {
        found = w.node;
        break;
      }
    }
    if (found !== view.current) {
      if (view.current) view.current.classList.remove("current");
      if (found) found.classList.add("current");
      view.current = found;
    }
  }

  function tick() {
    if (view.hasAudio) {
      const t = player.currentTime - view.offset;
      if (view.bounded && t >= view.duration && !player.paused) player.pause(); // ends mid-file
      setTime(t);
    }
  }

  function loop() {
    tick();
    view.raf = !player.paused && !player.ended ? requestAnimationFrame(loop) : 0;
  }

  // ---- the timeline: waveform, spectrogram, attention and CTC on one time axis ----
  function cssVar(name) {
    return getComputedStyle(document.documentElement).getPropertyValue(name).trim() || "#888";
  }

  function fitCanvas(canvas, height) {
    const dpr = window.devicePixelRatio || 1;
    const width = Math.max(1, canvas.clientWidth || canvas.parentElement.clientWidth || 600);
    canvas.style.height = `${height}px`;
    canvas.width = Math.round(width * dpr);
    canvas.height = Math.round(height * dpr);
    const ctx = canvas.getContext("2d");
    ctx.setTransform(dpr, 0, 0, dpr, 0, 0);
    return { ctx, width, height };
  }

  // Shows the canvas when there is something to draw, else the message in its place.
  // A row past the page's size limit keeps its text and audio link, not its arrays.
  const leftOut = () => !!view.u && list(view.u.flags).includes("maps left out");
  const LEFT_OUT = "left out to keep the page small (asr explore --max-mb)";

  function track(canvas, ok, message) {
    canvas.hidden = !ok;
    const missing = canvas.parentElement.querySelector(".missing");
    missing.textContent = view.loading ? "loading…" : leftOut() ? LEFT_OUT : message;
    missing.hidden = ok;
    return ok;
  }

  // Past MAX_COLUMNS frames, columns are max-pooled: canvases have a size limit, screens fewer pixels.
  const MAX_COLUMNS = 8192;

  function heatImage(width, height, valueAt, lut) {
    const stride = Math.ceil(width / MAX_COLUMNS);
    const columns = Math.ceil(width / stride);
    const canvas = document.createElement("canvas");
    canvas.width = columns;
    canvas.height = height;
    const ctx = canvas.getContext("2d");
    const image = ctx.createImageData(columns, height);
    const px = image.data;
    for (let y = 0; y < height; y++) {
      for (let c = 0; c < columns; c++) {
        let v = 0;
        for (let x = c * stride; x < Math.min(width, (c + 1) * stride); x++) v = Math.max(v, valueAt(x, y));
        const o = 4 * (y * columns + c);
        px[o] = lut[3 * v];
        px[o + 1] = lut[3 * v + 1];
        px[o + 2] = lut[3 * v + 2];
        px[o + 3] = 255;
      }
    }
    ctx.putImageData(image, 0, 0);
    return canvas;
  }

  function drawTimeline() {
    if (!view.u) return;
    drawWaveform();
    drawSpectrogram();
    drawAttention();
    drawCtc();
    drawAxis();
    setTime(view.time);
  }

  function drawWaveform() {
    const env = view.arrays.envelope;
    const canvas = $("#waveform");
    if (!track(canvas, !!env && env.shape.length === 2 && env.shape[1] === 2 && env.shape[0] > 0,
      "no waveform saved")) return;
    const { ctx, width, height } = fitCanvas(canvas, 72);
    const n = env.shape[0];
    const column = width / n;
    ctx.fillStyle = cssVar("--line");
    ctx.fillRect(0, height / 2, width, 1);
    ctx.fillStyle = cssVar("--wave");
    for (let i = 0; i < n; i++) {
      const top = (1 - env.data[2 * i + 1] / 255) * height;
      const bottom = (1 - env.data[2 * i] / 255) * height;
      ctx.fillRect(i * column, top, Math.max(column, 1), Math.max(bottom - top, 1));
    }
  }

  function drawSpectrogram() {
    const spec = view.arrays.spectrogram;
    const canvas = $("#spectrogram");
    delete canvas.dataset.checksum;
    if (!track(canvas, !!spec && spec.shape.length === 2 && spec.shape[0] > 0 && spec.shape[1] > 0,
      "no spectrogram saved")) return;
    const [mels, frames] = spec.shape;
    canvas.dataset.checksum = String(spec.data.reduce((a, b) => a + b, 0)); // what tests compare
    const seconds = num(spec.seconds) || view.duration / frames;
    const image = heatImage(frames, mels, (x, y) => spec.data[(mels - 1 - y) * frames + x], VIRIDIS);
    const { ctx, width, height } = fitCanvas(canvas, clamp(2 * mels, 64, 160));
    ctx.drawImage(image, 0, 0, image.width, mels, 0, 0, ((frames * seconds) / view.duration) * width, height);
  }

  function setupAttention(u) {
    const a = view.arrays.attention;
    const ok = !!a && a.shape.length === 3 && a.shape.every((n) => n > 0);
    $("#layer").disabled = $("#head").disabled = !ok;
    $("#attention-kind").textContent = ok ? text(u.attention_kind) || "cross-attention" : "";
    if (!ok) {
      $("#layer").replaceChildren();
      $("#head").replaceChildren();
      return;
    }
    const [maps, rows, frames] = a.shape;
    // One map (an RNN decoder's attention): nothing to choose between.
    for (const id of ["#layer", "#head"]) $(id).parentElement.hidden = maps === 1;
    let layers = num(u.layers);
    let heads = num(u.heads);
    if (!(Number.isInteger(layers) && Number.isInteger(heads) && layers * heads === maps)) {
      layers = 1;
      heads = maps;
    }
    const timing = [...new Set(list(u.timing_heads))]
      .filter((k) => Number.isInteger(k) && k >= 0 && k < maps);
    view.attn = {
      a, maps, rows, frames, layers, heads, timing, average: null,
      seconds: num(a.seconds) || view.duration / frames,
      layer: timing.length ? Math.floor(timing[0] / heads) : layers - 1,
      head: timing.length ? "avg" : 0,
    };
    $("#layer").replaceChildren(...Array.from({ length: layers }, (_, l) => {
      const marked = timing.some((k) => Math.floor(k / heads) === l);
      return el("option", { value: l }, `${l}${marked ? " *" : ""}`);
    }));
    $("#layer").value = String(view.attn.layer);
    fillHeads();
  }

  function fillHeads() {
    const at = view.attn;
    const options = Array.from({ length: at.heads }, (_, h) =>
      el("option", { value: h }, `${h}${at.timing.includes(at.layer * at.heads + h) ? " *" : ""}`));
    if (at.timing.length) options.unshift(el("option", { value: "avg" }, "average of timing heads *"));
    $("#head").replaceChildren(...options);
    $("#head").value = String(at.head);
  }

  // The selected map as uint8 [rows, frames]; the timing-head average is rescaled per row to 255.
  function attentionMap() {
    const at = view.attn;
    const size = at.rows * at.frames;
    if (at.head !== "avg") {
      const k = at.layer * at.heads + at.head;
      return at.a.data.subarray(k * size, (k + 1) * size);
    }
    if (!at.average) {
      const sum = new Float32Array(size);
      for (const k of at.timing) {
        const map = at.a.data.subarray(k * size, (k + 1) * size);
        for (let i = 0; i < size; i++) sum[i] += map[i];
      }
      at.average = new Uint8Array(size);
      for (let r = 0; r < at.rows; r++) {
        let max = 0;
        for (let t = 0; t < at.frames; t++) max = Math.max(max, sum[r * at.frames + t]);
        for (let t = 0; t < at.frames; t++) {
          at.average[r * at.frames + t] = max > 0 ? Math.round((255 * sum[r * at.frames + t]) / max) : 0;
        }
      }
    }
    return at.average;
  }

  function tokenLabel(i) {
    const tokens = list(view.u.tokens);
    if (i < tokens.length) return text(obj(tokens[i]).piece);
    return i === view.attn.rows - 1 ? "eos" : `#${i}`;
  }

  function drawAttention() {
    const canvas = $("#attention-canvas");
    const labels = $("#token-labels");
    const at = view.attn;
    $("#row-highlight").hidden = true;
    if (!track(canvas, !!at, "no attention saved")) {
      labels.replaceChildren("attention");
      for (const key of ["layer", "head", "checksum"]) canvas.removeAttribute(`data-${key}`);
      return;
    }
    let rowHeight = clamp(Math.floor(360 / at.rows), 8, 20);
    if (at.rows * rowHeight > 8000) rowHeight = 8000 / at.rows; // long transcripts: rows thinner than text
    view.rowHeight = rowHeight;
    const font = rowHeight < 8 ? 0 : Math.min(rowHeight - 1, 12);
    labels.replaceChildren(...Array.from({ length: at.rows }, (_, i) => el("div", {
      "data-row": i, dir: "auto", title: tokenLabel(i),
      style: `height:${rowHeight}px;line-height:${rowHeight}px;font-size:${font}px`,
    }, tokenLabel(i))));
    const map = attentionMap();
    const image = heatImage(at.frames, at.rows, (x, y) => map[y * at.frames + x], BLUES);
    const { ctx, width, height } = fitCanvas(canvas, at.rows * rowHeight);
    ctx.imageSmoothingEnabled = false; // one block per frame and token
    ctx.fillStyle = cssVar("--panel");
    ctx.fillRect(0, 0, width, height);
    const span = ((at.frames * at.seconds) / view.duration) * width;
    ctx.drawImage(image, 0, 0, image.width, at.rows, 0, 0, span, height);
    let checksum = 0;
    for (let i = 0; i < map.length; i++) checksum += map[i];
    canvas.dataset.layer = String(at.layer);
    canvas.dataset.head = String(at.head);
    canvas.dataset.checksum = String(checksum);
  }

  function drawCtc() {
    const c = view.arrays.ctc;
    const strip = $("#ctc-strip");
    if (!c || c.shape.length !== 1 || !c.shape[0]) {
      const message = view.loading ? "" : leftOut() ? LEFT_OUT : "no CTC path saved";
      strip.replaceChildren(el("span", { class: "na" }, message));
      return;
    }
    const frames = c.shape[0];
    const seconds = num(c.seconds) || view.duration / frames;
    const tokens = list(view.u.tokens);
    const spans = [];
    for (let t = 0; t < frames;) {
      const k = c.data[t];
      let end = t + 1;
      while (end < frames && c.data[end] === k) end++;
      if (k >= 0) {
        const label = k < tokens.length ? text(obj(tokens[k]).piece) : `#${k}`;
        const span = el("span", {
          "data-row": k, dir: "auto", title: `${label}: ${(t * seconds).toFixed(2)} s`,
        }, label);
        span.style.left = `${((100 * t * seconds) / view.duration).toFixed(3)}%`;
        span.style.width = `${((100 * (end - t) * seconds) / view.duration).toFixed(3)}%`;
        spans.push(span);
      }
      t = end;
    }
    strip.replaceChildren(...spans);
  }

  function drawAxis() {
    const steps = [0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 30, 60, 120, 300, 600, 1800, 3600];
    // past the longest step, whole hours: ten ticks however long (a step added to a huge
    // time changes nothing, and the loop would not end)
    const step = steps.find((s) => view.duration / s <= 10) || 3600 * Math.ceil(view.duration / 36000);
    const ticks = [];
    for (let t = 0; t < view.duration; t += step) {
      const tick = el("span", {}, String(+t.toFixed(1)));
      tick.style.left = `${((100 * t) / view.duration).toFixed(3)}%`;
      ticks.push(tick);
    }
    $("#axis").replaceChildren(...ticks);
  }

  // ---- hovering the attention: a token's row and time span, a time's strongest tokens ----
  function showSpan(start, end) {
    const span = $("#span-highlight");
    span.hidden = start === null || end === null;
    if (span.hidden) return;
    span.style.left = `${(100 * clamp(start / view.duration, 0, 1)).toFixed(3)}%`;
    span.style.width = `${(100 * clamp((end - start) / view.duration, 0, 1)).toFixed(3)}%`;
  }

  function highlightRow(i) {
    const at = view.attn;
    for (const label of document.querySelectorAll("#token-labels .hover")) label.classList.remove("hover");
    const box = $("#row-highlight");
    if (!at || i === null || i < 0 || i >= at.rows) {
      box.hidden = true;
      showSpan(null, null);
      return;
    }
    const label = $("#token-labels").children[i];
    if (label) label.classList.add("hover");
    box.hidden = false;
    box.style.top = `${i * view.rowHeight}px`;
    box.style.height = `${view.rowHeight}px`;
    const token = obj(list(view.u.tokens)[i]);
    if (num(token.start) !== null && num(token.end) !== null) {
      showSpan(token.start, token.end);
      return;
    }
    const map = attentionMap(); // no token times: the frame it attends to most
    let best = 0;
    for (let t = 1; t < at.frames; t++) if (map[i * at.frames + t] > map[i * at.frames + best]) best = t;
    showSpan(best * at.seconds, (best + 1) * at.seconds);
  }

  function hoverHeatmap(event) {
    const at = view.attn;
    if (!at) return;
    const rect = event.currentTarget.getBoundingClientRect();
    const time = ((event.clientX - rect.left) / rect.width) * view.duration;
    const frame = Math.floor(time / at.seconds);
    highlightRow(Math.floor((event.clientY - rect.top) / view.rowHeight));
    if (frame < 0 || frame >= at.frames) {
      $("#attention-hover").textContent = "";
      return;
    }
    const map = attentionMap();
    const top = Array.from({ length: at.rows }, (_, r) => [r, map[r * at.frames + frame]])
      .filter(([, v]) => v > 0).sort((a, b) => b[1] - a[1]).slice(0, 3);
    const names = top.map(([r, v]) => `${tokenLabel(r)} (${Math.round((100 * v) / 255)}%)`);
    $("#attention-hover").textContent =
      `${time.toFixed(2)} s, frame ${frame}: ${names.length ? names.join(", ") : "no attention"}`;
  }

  function clearHover() {
    highlightRow(null);
    $("#attention-hover").textContent = "";
  }

  // ---- training ----
  const PALETTE = ["#2f6fdf", "#e0245e", "#1f9d55", "#d97706", "#7c3aed", "#0891b2"];

  function chart(title, series, epochs) {
    const W = 420, H = 220, left = 48, right = 12, top = 12, bottom = 28;
    const values = series.flatMap(([, v]) => v).filter(Number.isFinite);
    let lo = Math.min(...values);
    let hi = Math.max(...values);
    if (lo === hi) [lo, hi] = [lo - 1, hi + 1];
    const e0 = Math.min(...epochs);
    const e1 = Math.max(...epochs);
    const x = (e) => left + ((e - e0) / (e1 - e0 || 1)) * (W - left - right);
    const y = (v) => top + (1 - (v - lo) / (hi - lo)) * (H - top - bottom);
    const plot = svg("svg", { class: "chart", viewBox: `0 0 ${W} ${H}`, role: "img" });
    plot.append(
      svg("line", { class: "axis", x1: left, y1: top, x2: left, y2: H - bottom }),
      svg("line", { class: "axis", x1: left, y1: H - bottom, x2: W - right, y2: H - bottom }));
    for (const v of [lo, (lo + hi) / 2, hi]) {
      const label = svg("text", { x: left - 4, y: y(v) + 4, "text-anchor": "end" });
      label.textContent = +v.toPrecision(4);
      plot.append(label);
    }
    for (const e of new Set([e0, e1])) {
      const anchor = e === e0 ? "start" : "end"; // inside the chart at both ends
      const label = svg("text", { x: x(e), y: H - bottom + 16, "text-anchor": anchor });
      label.textContent = `epoch ${e}`;
      plot.append(label);
    }
    const legend = el("div", { class: "chart-legend" });
    series.forEach(([name, vals], s) => {
      const colour = PALETTE[s % PALETTE.length];
      let d = "";
      let pen = "M";
      vals.forEach((v, i) => {
        if (Number.isNaN(v)) pen = "M"; // a gap where the value is not finite
        else if (v !== null) { // null: not logged that epoch (validation every n), no gap
          d += `${pen}${x(epochs[i]).toFixed(1)},${y(v).toFixed(1)} `;
          pen = "L";
          const dot = svg("circle", { cx: x(epochs[i]), cy: y(v), r: 2.5, fill: colour });
          const tip = svg("title");
          tip.textContent = `${name}, epoch ${epochs[i]}: ${+v.toPrecision(5)}`;
          dot.append(tip);
          plot.append(dot);
        }
      });
      plot.append(svg("path", { d: d.trim() || "M0,0", stroke: colour }));
      const swatch = el("i");
      swatch.style.background = colour;
      legend.append(el("span", { dir: "auto" }, swatch, name));
    });
    return el("figure", {}, el("figcaption", { dir: "auto" }, title), plot, legend);
  }

  function renderCurves(curves) {
    const epochs = list(curves.epoch).map(num);
    const groups = new Map(); // "train/loss" and "val/loss" share the chart "loss"
    for (const [name, raw] of Object.entries(obj(curves.series))) {
      // a string ("nan", "inf", "-inf") is a value that is not finite: NaN, a gap
      const values = list(raw).map((v) => (typeof v === "string" ? NaN : num(v)))
        .slice(0, epochs.length);
      const usable = values.filter((v, i) => Number.isFinite(v) && epochs[i] !== null);
      if (!usable.length) continue;
      const group = name.split("/").pop();
      if (!groups.has(group)) groups.set(group, []);
      groups.get(group).push([name, values.map((v, i) => (epochs[i] === null ? null : v))]);
    }
    const known = epochs.map((e, i) => (e === null ? i : e));
    $("#curves").replaceChildren(...[...groups.entries()].map(([g, s]) => chart(g, s, known)));
    if (!groups.size) $("#curves").append(el("p", { class: "na" }, "no training curves"));
  }

  function renderPlots(plots) {
    $("#plots").replaceChildren(...list(plots).map((p) => {
      const name = text(obj(p).utterance);
      const figure = el("figure", {}, el("figcaption", { dir: "auto" }, name));
      const epochs = list(obj(p).epochs).map(obj).filter((e) => typeof e.image === "string");
      if (!epochs.length) {
        figure.append(el("p", { class: "na" }, "no images"));
        return figure;
      }
      const last = epochs.length - 1;
      const image = el("img", { class: "epoch-image" });
      const label = el("span");
      const slider = el("input", {
        type: "range", class: "epoch-slider", min: 0, max: last, step: 1, value: last,
        "aria-label": `epoch of ${name}`,
      });
      const show = (i) => {
        const e = epochs[clamp(i, 0, last)];
        image.src = e.image;
        image.alt = `${name}, epoch ${text(e.epoch)}`;
        label.textContent = `epoch ${text(e.epoch)}`;
      };
      show(last);
      slider.addEventListener("input", () => show(Number(slider.value)));
      figure.append(image, el("div", { class: "slider" }, slider, label));
      return figure;
    }));
  }

  function renderTraining(training) {
    if (!training || typeof training !== "object") return;
    $("#training").hidden = false;
    guard("training curves", () => renderCurves(obj(training.curves)));
    guard("training plots", () => renderPlots(training.plots));
  }

  // ---- events ----
  function wire() {
    $("#utterances thead").addEventListener("click", (e) => {
      const th = e.target.closest("th[data-key]");
      if (th) sortBy(th.dataset.key);
    });
    $("#utterances thead").addEventListener("keydown", (e) => {
      const th = e.target.closest("th[data-key]");
      if (th && (e.key === "Enter" || e.key === " ")) { e.preventDefault(); sortBy(th.dataset.key); }
    });
    const open = (tr) => {
      const row = tr && table.rows[Number(tr.dataset.index)];
      if (row) openUtterance(row).catch((err) => console.error("explorer: utterance:", err));
    };
    $("#utterances tbody").addEventListener("click", (e) => open(e.target.closest("tr")));
    $("#utterances tbody").addEventListener("keydown", (e) => {
      if (e.key === "Enter") open(e.target.closest("tr"));
    });
    $("#filter").addEventListener("input", renderTable);
    $("#filter").addEventListener("keydown", (e) => {
      if (e.key === "Escape") { e.target.value = ""; renderTable(); }
    });
    const step = (by) => {
      const i = table.visible.indexOf(view.row) + by;
      if (i >= 0 && i < table.visible.length) open(table.visible[i].tr);
    };
    $("#prev").addEventListener("click", () => step(-1));
    $("#next").addEventListener("click", () => step(1));

    for (const box of ["#hyp", "#ref", "#alignment"]) {
      $(box).addEventListener("click", (e) => {
        const word = e.target.closest("[data-start]");
        if (word) seek(Number(word.dataset.start));
      });
    }
    $("#tracks").addEventListener("click", (e) => {
      const plot = e.target.closest(".plot");
      if (!plot || !view.u) return;
      const rect = plot.getBoundingClientRect();
      seek(clamp((e.clientX - rect.left) / rect.width, 0, 1) * view.duration);
    });
    $("#play").addEventListener("click", () => {
      if (!player.paused) player.pause();
      else if (view.bounded && player.currentTime - view.offset >= view.duration) seek(0);
      else player.play().catch(() => {});
    });
    for (const type of ["timeupdate", "seeked", "seeking", "pause", "ended"]) {
      player.addEventListener(type, tick);
    }
    player.addEventListener("play", () => {
      $("#play").textContent = "pause";
      if (!view.raf) view.raf = requestAnimationFrame(loop);
    });
    player.addEventListener("pause", () => { $("#play").textContent = "play"; });
    player.addEventListener("error", () => {
      if (!view.hasAudio) return;
      const src = text(view.u && view.u.audio).slice(0, 80);
      $("#audio-note").textContent = `the audio could not be played (${src})`;
      $("#audio-note").hidden = false;
    });

    $("#layer").addEventListener("change", () => {
      const at = view.attn;
      if (!at) return;
      if (at.head === "avg") at.head = 0; // choosing a layer asks for one of its heads
      at.layer = Number($("#layer").value);
      fillHeads();
      guard("attention", drawAttention);
    });
    $("#head").addEventListener("change", () => {
      const at = view.attn;
      if (!at) return;
      const head = $("#head").value;
      at.head = head === "avg" ? "avg" : Number(head);
      guard("attention", drawAttention);
    });

    $("#token-labels").addEventListener("mouseover", (e) => {
      const label = e.target.closest("[data-row]");
      if (label) highlightRow(Number(label.dataset.row));
    });
    $("#token-labels").addEventListener("mouseleave", clearHover);
    $("#ctc-strip").addEventListener("mouseover", (e) => {
      const span = e.target.closest("[data-row]");
      if (span) highlightRow(Number(span.dataset.row));
    });
    $("#ctc-strip").addEventListener("mouseleave", clearHover);
    $("#attention-canvas").addEventListener("mousemove", hoverHeatmap);
    $("#attention-canvas").addEventListener("mouseleave", clearHover);

    let pending = 0;
    window.addEventListener("resize", () => {
      cancelAnimationFrame(pending);
      pending = requestAnimationFrame(() => guard("timeline", drawTimeline));
    });
  }

  const data = readData();
  $("#title").textContent = text(data.title) || "asr explorer";
  $("#kind").textContent = text(data.kind);
  for (const note of list(data.notes)) addNote(note);
  const utterances = list(data.utterances).map(obj);
  guard("events", wire);
  guard("summary", () => renderSummary(data.summary));
  guard("decode B", () => renderCompare(data.compare));
  guard("speakers", () => renderSpeakers(utterances));
  guard("utterance table", () => buildTable(utterances));
  renderTraining(data.training);
  // a training run has curves and plots, no utterance table
  $("#overview").hidden = data.kind === "training" && !utterances.length;
  document.body.dataset.ready = "1";
})();
