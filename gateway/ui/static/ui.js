// The dashboard's only script: live updates from /ui/events (server-sent
// events), the search box, the "more" control and the job page's log tail.
"use strict";
(function () {
  const body = document.body;
  const on = (body.dataset.on || "").split(" ").filter(Boolean);
  const live = document.getElementById("live");
  let timer = null;

  // Fetch the page's live part again (at most once a second).
  function refresh() {
    if (!live || timer) return;
    timer = setTimeout(async () => {
      timer = null;
      const r = await fetch(live.dataset.part, {credentials: "same-origin"});
      if (r.ok) { live.innerHTML = await r.text(); search(); more(); }
    }, 1000);
  }

  // Jobs page: patch the row of a job, or fetch the row of a new one.
  async function patchRow(ev) {
    const rows = document.getElementById("rows");
    if (!rows) return;
    const row = rows.querySelector(`tr[data-id="${CSS.escape(ev.id)}"]`);
    if (row) {
      row.dataset.phase = ev.phase;
      row.querySelector(".phase").textContent = ev.phase;
      row.classList.add("flash");
      return;
    }
    const r = await fetch("?id=" + encodeURIComponent(ev.id), {credentials: "same-origin"});
    if (!r.ok) return;
    const html = await r.text();
    // another event may have inserted the row meanwhile
    if (!rows.querySelector(`tr[data-id="${CSS.escape(ev.id)}"]`)) {
      rows.insertAdjacentHTML("afterbegin", html);
      search();
    }
  }

  function handle(ev) {
    if (ev.kind === "reload") return refresh();
    for (const want of on) {
      if (want === "rows" && ev.kind === "job") return patchRow(ev);
      if (want === ev.kind) return refresh();
      if (want === "job:" + ev.id && (ev.kind === "job" || ev.kind === "explain")) {
        return refresh();
      }
    }
  }

  if (on.length && window.EventSource) {
    const source = new EventSource("/ui/events");
    source.onmessage = (m) => handle(JSON.parse(m.data));
    source.onopen = () => { body.dataset.live = "1"; };  // for the page's reader (and tests)
  }

  // The search box: hide the loaded rows that do not contain the text.
  function search() {
    const q = document.getElementById("q");
    if (!q) return;
    const text = q.value.toLowerCase();
    for (const tr of document.querySelectorAll("#rows tr")) {
      tr.hidden = text !== "" && !tr.textContent.toLowerCase().includes(text);
    }
  }
  const q = document.getElementById("q");
  if (q) q.addEventListener("input", search);

  // "more": the next page of rows, appended.
  function more() {
    const button = document.getElementById("more");
    if (!button) return;
    button.onclick = async () => {
      const url = button.dataset.url + "&offset=" + button.dataset.offset;
      const r = await fetch(url, {credentials: "same-origin"});
      if (!r.ok) return;
      const html = await r.text();
      document.getElementById("rows").insertAdjacentHTML("beforeend", html);
      const added = (html.match(/<tr/g) || []).length;
      button.dataset.offset = String(Number(button.dataset.offset) + added);
      document.getElementById("shown").textContent = button.dataset.offset;
      if (added === 0) button.remove();
      search();
    };
  }
  more();

  // The job page's log: GET /jobs/{id}/logs?follow=true streams NDJSON, one
  // {"at","server","rank","text"} object a line, until the job ends.
  async function followLogs(pre) {
    const r = await fetch(pre.dataset.url, {credentials: "same-origin"});
    // 404: no logs endpoint on this gateway, or no logs of this job
    if (!r.ok || !r.body) { pre.textContent = "no logs"; pre.dataset.ended = "1"; return; }
    const reader = r.body.getReader();
    const decoder = new TextDecoder();
    let rest = "";
    for (;;) {
      const {value, done} = await reader.read();
      if (done) break;
      rest += decoder.decode(value, {stream: true});
      const lines = rest.split("\n");
      rest = lines.pop();
      for (const line of lines) {
        if (!line.trim()) continue;
        const l = JSON.parse(line);
        pre.append(`[${l.server} ${l.rank}] ${l.text}\n`);
        pre.scrollTop = pre.scrollHeight;
      }
    }
    pre.dataset.ended = "1";
  }
  const logs = document.getElementById("logs");
  if (logs) followLogs(logs).catch(() => { logs.textContent = "no logs"; });
})();
