// middlebox console: hand-written, no build step, no CDN. Reads the live feed (SSE), draws
// one stream's two sides, and edits the fault list through the control API's /faults.
"use strict";
(function () {
  const token = new URLSearchParams(location.search).get("token");
  const q = (path) => (token ? path + (path.includes("?") ? "&" : "?") + "token=" + encodeURIComponent(token) : path);
  const $ = (id) => document.getElementById(id);
  let connections = [];
  let selected = null;
  let shownVersion = -1;
  // when each connection was first shown cut (wall clock, s): what the drill test reads
  window.cutShownAt = {};

  function el(tag, attrs, text) {
    const node = document.createElement(tag);
    for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
    if (text !== undefined) node.textContent = text;
    return node;
  }

  async function api(method, path, body) {
    const response = await fetch(q(path), {
      method, body: body === undefined ? undefined : JSON.stringify(body),
      headers: body === undefined ? {} : { "content-type": "application/json" },
    });
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    return { status: response.status, data };
  }

  // ------------------------------------------------------------- connections
  function renderConnections() {
    const filter = $("filter").value;
    const list = $("connections");
    list.replaceChildren();
    for (const c of connections) {
      if (c.state === "cut" && !(c.id in window.cutShownAt)) window.cutShownAt[c.id] = Date.now() / 1000;
      if (filter && c.state !== filter) continue;
      const button = el("button", { type: "button", "data-id": c.id, "aria-pressed": String(c.id === selected) });
      button.append(el("span", { class: "state " + c.state }, c.state));
      button.append(document.createTextNode(
        ` #${c.id} ${c.status || ""} ` +
        (c.framed ? `${c.tokens.upstream}→${c.tokens.client} tokens` : `${c.bytes.upstream}→${c.bytes.client} bytes`) +
        (c.ending ? `, ${c.ending}` : "") + (c.kinds.length ? ` · ${c.kinds.join(", ")}` : "")));
      button.addEventListener("click", () => { $("follow").checked = false; select(c.id); });
      const item = el("li");
      item.append(button);
      list.append(item);
    }
  }

  function select(id) {
    selected = id;
    shownVersion = -1;
    renderConnections();
    refreshStream();
  }

  function follow() {
    if (!$("follow").checked) return;
    const newest = connections.find((c) => c.bytes.upstream > 0 || c.bytes.client > 0);
    if (newest && newest.id !== selected) { selected = newest.id; shownVersion = -1; }
  }

  // ------------------------------------------------------------------ stream
  async function refreshStream() {
    if (selected === null) return;
    const summary = connections.find((c) => c.id === selected);
    if (summary && summary.version === shownVersion && summary.state !== "open") return;
    const { status, data } = await api("GET", "/api/streams/" + selected);
    if (status !== 200) return;
    shownVersion = data.version;
    drawStream(data);
  }

  function drawStream(s) {
    $("stream-title").textContent = `Stream #${s.id} (${s.scenario})`;
    $("words").textContent = s.words.length ? s.words.join("; ") : (s.state === "open" ? "streaming; nothing unusual yet" : "smooth: the client got what the upstream sent, as it was sent");
    $("words").dataset.kinds = s.kinds.join(",");
    const up = s.sides.upstream, client = s.sides.client;
    const w = 600, h = 240, pad = 32;
    const all = up.tokens.concat(client.tokens, s.fault_marks.map((f) => f.at), [0.001]);
    const tmax = Math.max(...all) * 1.05;
    const nmax = Math.max(up.total_tokens, client.total_tokens, 1);
    const x = (t) => pad + (t / tmax) * (w - 2 * pad);
    const y = (n) => h - pad - (n / nmax) * (h - 2 * pad);
    const svg = $("chart");
    const ns = "http://www.w3.org/2000/svg";
    svg.replaceChildren();
    const line = (times, cls) => {
      const path = document.createElementNS(ns, "polyline");
      let points = `${x(0)},${y(0)}`;
      times.forEach((t, i) => { points += ` ${x(t)},${y(i)} ${x(t)},${y(i + 1)}`; });
      path.setAttribute("points", points);
      path.setAttribute("class", cls);
      path.dataset.count = String(times.length);
      svg.append(path);
    };
    for (const f of s.fault_marks) {
      const mark = document.createElementNS(ns, "line");
      mark.setAttribute("x1", x(f.at)); mark.setAttribute("x2", x(f.at));
      mark.setAttribute("y1", pad / 2); mark.setAttribute("y2", h - pad);
      mark.setAttribute("class", "fault");
      const title = document.createElementNS(ns, "title");
      title.textContent = `${f.fault}: ${f.action} at ${f.at.toFixed(3)} s`;
      mark.append(title);
      svg.append(mark);
    }
    line(up.tokens, "upstream");
    line(client.tokens, "client");
    const label = (text, tx, ty) => { const t = document.createElementNS(ns, "text"); t.setAttribute("x", tx); t.setAttribute("y", ty); t.textContent = text; svg.append(t); };
    label("0 s", pad, h - pad / 3);
    label(`${tmax.toFixed(2)} s`, w - pad * 2, h - pad / 3);
    label(`${nmax} tokens`, 2, pad / 2);
    if (up.done) label("[DONE] upstream", x(up.tokens.at(-1) || 0) - 60, y(nmax) - 4);
    if (client.done) label("[DONE] client", x(client.tokens.at(-1) || 0) - 50, y(nmax) + 12);
    // how far apart the two lines are: the largest lag of a token reaching the client
    let lag = 0;
    client.tokens.forEach((t, i) => { if (i < up.tokens.length) lag = Math.max(lag, t - up.tokens[i]); });
    if (client.tokens.length < up.tokens.length && up.tokens.length) lag = Math.max(lag, s.age - up.tokens[client.tokens.length]);
    svg.dataset.lag = lag.toFixed(3);
    const fig = $("figures");
    fig.replaceChildren();
    const row = (k, v) => { fig.append(el("dt", {}, k)); fig.append(el("dd", {}, v)); };
    const ms = (v) => (v === null ? "–" : `${Math.round(v * 1000)} ms`);
    row("TTFT", `upstream ${ms(up.ttft)}, client ${ms(client.ttft)}`);
    row("largest gap", `upstream ${ms(up.largest_gap)}, client ${ms(client.largest_gap)}`);
    row("largest lag", ms(lag));
    row("terminal event", `upstream ${up.done ? "seen" : "absent"}, client ${client.done ? "seen" : "absent"}`);
    row("ended", s.ending || "open");
    row("bytes", `request ${s.bytes.request}, upstream ${s.bytes.upstream}, client ${s.bytes.client}`);
  }

  // ------------------------------------------------------------------ faults
  function showProblems(node, data) {
    node.textContent = data ? [data.error, ...(data.problems || [])].filter(Boolean).join("\n") : "";
  }

  async function loadFaults() {
    const { status, data } = await api("GET", "/faults");
    if (status !== 200) return;
    $("scenario").textContent = "scenario: " + data.scenario;
    const list = $("faults");
    list.replaceChildren();
    data.faults.forEach((f, i) => {
      const item = el("li", { "data-fault": f.fault });
      const id = "fault-options-" + i;
      item.append(el("label", { for: id }, `${i}. ${f.fault}`));
      const area = el("textarea", { id, rows: "1", "aria-label": `${f.fault} options (JSON)` });
      area.value = JSON.stringify(f.options);
      item.append(area);
      const problems = el("div", { class: "problems", role: "alert" });
      const button = (text, attrs, action) => { const b = el("button", { type: "button", ...attrs }, text); b.addEventListener("click", action); item.append(b); };
      button("Save", { "data-save": i }, async () => {
        let options;
        try { options = JSON.parse(area.value); } catch (e) { showProblems(problems, { error: "not JSON: " + e.message }); return; }
        const r = await api("PATCH", "/faults/" + i, options);
        showProblems(problems, r.status < 300 ? null : r.data);
        if (r.status < 300) loadFaults();
      });
      button("Remove", { "data-remove": i, "aria-label": `remove ${f.fault}` }, async () => {
        const r = await api("DELETE", "/faults/" + i);
        showProblems(problems, r.status < 300 ? null : r.data);
        if (r.status < 300) loadFaults();
      });
      const move = async (to) => {
        const gone = await api("DELETE", "/faults/" + i);
        if (gone.status >= 300) { showProblems(problems, gone.data); return; }
        const r = await api("POST", "/faults", { fault: f.fault, options: f.options, at: to });
        showProblems(problems, r.status < 300 ? null : r.data);
        loadFaults();
      };
      if (i > 0) button("Up", { "aria-label": `move ${f.fault} up` }, () => move(i - 1));
      if (i < data.faults.length - 1) button("Down", { "aria-label": `move ${f.fault} down` }, () => move(i + 1));
      item.append(problems);
      list.append(item);
    });
    if (!data.faults.length) list.append(el("li", {}, "no faults: a byte-exact relay"));
  }

  $("add-form").addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = $("add-entry").value;
    const response = await fetch(q("/faults"), { method: "POST", body: text, headers: { "content-type": "application/yaml" } });
    let data = null;
    try { data = await response.json(); } catch (e) { data = null; }
    showProblems($("add-problems"), response.status < 300 ? null : data);
    if (response.status < 300) { $("add-entry").value = ""; loadFaults(); }
  });

  async function loadPresets() {
    const { status, data } = await api("GET", "/api/presets");
    if (status !== 200) return;
    const holder = $("presets");
    holder.replaceChildren();
    for (const name of data.presets) {
      const b = el("button", { type: "button", "data-preset": name }, "+ " + name);
      b.addEventListener("click", () => { $("add-entry").value = "preset: " + name; $("add-entry").focus(); });
      holder.append(b);
    }
  }

  // ------------------------------------------------------------------- drill
  let hintsShown = 0;
  function renderDrill(d) {
    const panel = $("drill-panel");
    if (!d) { panel.hidden = true; return; }
    panel.hidden = false;
    const box = $("drill");
    box.replaceChildren();
    box.append(el("p", {}, `${d.name}: ${d.title || ""}`));
    const symptoms = el("ul", { id: "symptoms" });
    for (const s of d.symptoms || []) symptoms.append(el("li", {}, s));
    box.append(el("h3", {}, "Symptoms"), symptoms);
    const hints = el("ol", { id: "hints" });
    (d.hints || []).slice(0, hintsShown).forEach((h) => hints.append(el("li", {}, h)));
    box.append(el("h3", {}, "Hints"), hints);
    if (hintsShown < (d.hints || []).length) {
      const more = el("button", { type: "button", id: "next-hint" }, `Show hint ${hintsShown + 1} of ${d.hints.length}`);
      more.addEventListener("click", () => { hintsShown += 1; renderDrill(d); $("next-hint")?.focus(); });
      box.append(more);
    }
    if (d.check) box.append(el("p", { id: "drill-check" }, `drill check: ${d.check}`));
  }

  // -------------------------------------------------------------------- feed
  function connect() {
    const feed = new EventSource(q("/feed"));
    feed.addEventListener("open", () => { $("feed-state").textContent = "live"; });
    feed.addEventListener("error", () => { $("feed-state").textContent = "reconnecting…"; });
    feed.addEventListener("update", (event) => {
      const data = JSON.parse(event.data);
      connections = data.connections;
      // the proxy spaces updates further apart while the page's work would cost it CPU
      $("feed-state").textContent = `live, ${Math.round(1 / data.feed_interval)} updates/s`;
      $("held").textContent = data.held > connections.length
        ? `the newest ${connections.length} of ${data.held} held` : "";
      if ($("scenario").textContent !== "scenario: " + data.scenario) loadFaults();
      follow();
      renderConnections();
      refreshStream();
    });
    feed.addEventListener("drill", (event) => renderDrill(JSON.parse(event.data)));
  }

  $("filter").addEventListener("change", renderConnections);
  loadFaults();
  loadPresets();
  connect();
})();
