// capstack's report page: the rows of the data embedded in <script id="page-data">, rendered a
// page at a time (more as the last one scrolls into view), searched, filtered and ranked in the
// browser. No network: every file it shows lies beside index.html.
//
// The state (view, search, filter, value, flip) is read from and written to the URL's #fragment
// (#q=circle&filter=a&value=CIDEr&flip=1), so a link opens the page as it was seen.
// After the first render <html> carries data-render-ms (performance.now() then), data-matching
// (rows that pass the search and filter) and data-shown (rows in the document).
"use strict";

(function () {
  const PAGE = 50; // rows added at a time
  const data = JSON.parse(document.getElementById("page-data").textContent);
  const $ = (id) => document.getElementById(id);
  const controls = {view: $("view"), q: $("q"), filter: $("filter"), value: $("value"),
                    flip: $("flip")};
  const list = $("rows"), more = $("more"), count = $("count"), sentinel = $("sentinel");
  let order = [], shown = 0, view = data.views[0];

  function esc(text) {
    return String(text).replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;",
                                                     '"': "&quot;", "'": "&#39;"}[c]));
  }

  function fmt(x) {
    return (100 * x).toFixed(1);
  }

  function signed(x) {
    const s = fmt(x);
    return x > 0 ? "+" + s : s;
  }

  // -- state in the fragment ------------------------------------------------------------------
  function readState() {
    const state = new URLSearchParams(location.hash.replace(/^#/, ""));
    const v = Number(state.get("view") || 0);
    view = data.views[Number.isInteger(v) && v >= 0 && v < data.views.length ? v : 0];
    controls.view.value = String(data.views.indexOf(view));
    controls.q.value = state.get("q") || "";
    controls.filter.value = ["a", "b", "tie"].includes(state.get("filter")) ?
      state.get("filter") : "all";
    fillValues(state.get("value"));
    controls.flip.checked = state.get("flip") === "1";
  }

  function writeState() {
    const state = new URLSearchParams();
    if (controls.view.value !== "0") state.set("view", controls.view.value);
    if (controls.q.value) state.set("q", controls.q.value);
    if (controls.filter.value !== "all") state.set("filter", controls.filter.value);
    if (controls.value.value !== view.value) state.set("value", controls.value.value);
    if (controls.flip.checked) state.set("flip", "1");
    const hash = state.toString();
    history.replaceState(null, "", hash ? "#" + hash : location.pathname + location.search);
  }

  function fillValues(wanted) {
    controls.value.innerHTML = view.values.map(
      (v) => `<option value="${esc(v)}">${esc(v)}</option>`).join("");
    controls.value.value = view.values.includes(wanted) ? wanted : view.value;
    controls.value.disabled = view.values.length === 0;
  }

  // -- which rows, in which order ---------------------------------------------------------------
  function words(row) {
    if (row.text === undefined) {
      row.text = (row.c.flat().join(" ") + " " + row.r.join(" ")).toLowerCase();
    }
    return row.text;
  }

  function select() {
    const k = view.values.indexOf(controls.value.value);
    const two = view.sides.length === 2;
    const terms = controls.q.value.toLowerCase().split(/\s+/).filter(Boolean);
    const filter = two ? controls.filter.value : "all";
    const key = (row) => (k < 0 ? 0 : (two ? row.v[k][0] - row.v[k][1] : row.v[k][0]));
    order = view.rows.filter((row) => {
      const d = key(row);
      if (filter === "a" && !(d > 0)) return false;
      if (filter === "b" && !(d < 0)) return false;
      if (filter === "tie" && d !== 0) return false;
      return terms.every((t) => words(row).includes(t));
    });
    const flip = controls.flip.checked ? -1 : 1;
    order.sort((x, y) => flip * (key(y) - key(x)) || x.id - y.id);
    list.innerHTML = "";
    shown = 0;
    addRows();
    const ahead = view.sides.length === 2 ? counts(k) : "";
    count.textContent = `${order.length} of ${view.rows.length} images${ahead}`;
    document.documentElement.dataset.matching = String(order.length);
  }

  function counts(k) {
    if (k < 0) return "";
    let a = 0, b = 0;
    for (const row of view.rows) {
      const d = row.v[k][0] - row.v[k][1];
      if (d > 0) a++; else if (d < 0) b++;
    }
    const ties = view.rows.length - a - b;
    return ` (of all: A ahead on ${a}, B ahead on ${b}, ${ties} ties)`;
  }

  // -- rows ---------------------------------------------------------------------------------
  function caption(text, marked) {
    const marks = new Set(marked || []);
    return text.split(" ").map((w, i) => (marks.has(i) ? `<mark>${esc(w)}</mark>` : esc(w)))
      .join(" ");
  }

  function side(row, s) {
    const captions = row.c[s];
    const who = view.sides.length === 2 ? `<span class="who side-${s}">${"AB"[s]}</span>` : "";
    const first = captions.length ? caption(captions[0], row.m && row.m[s]) :
      '<span class="none">no caption</span>';
    const rest = captions.length > 1 ?
      `<details class="nbest"><summary>${captions.length} captions</summary><ol>` +
      captions.map((c) => `<li>${esc(c)}</li>`).join("") + "</ol></details>" : "";
    return `<div class="cap">${who}<span class="words">${first}</span>${rest}</div>`;
  }

  function scores(row) {
    if (!view.values.length) return "";
    const two = view.sides.length === 2;
    const cells = (f) => row.v.map((pair, k) => {
      const chosen = view.values[k] === controls.value.value ? ' class="chosen"' : "";
      return `<td${chosen}>${f(pair)}</td>`;
    }).join("");
    const head = "<tr><th></th>" + view.values.map((v) => `<th>${esc(v)}</th>`).join("") +
      "</tr>";
    const lines = two ?
      `<tr><th class="side-0">A</th>${cells((p) => fmt(p[0]))}</tr>` +
      `<tr><th class="side-1">B</th>${cells((p) => fmt(p[1]))}</tr>` +
      `<tr><th>A − B</th>${cells((p) => signed(p[0] - p[1]))}</tr>` :
      `<tr><th></th>${cells((p) => fmt(p[0]))}</tr>`;
    return `<table class="scores">${head}${lines}</table>`;
  }

  function pictures(row) {
    const shown = (row.a || []).map((src, s) => (src ?
      `<a href="${esc(src)}"><img class="att" loading="lazy" src="${esc(src)}" ` +
      `alt="attention of ${view.sides.length === 2 ? "AB"[s] : "the decoder"}"></a>` : ""))
      .join("");
    return shown ? `<div class="atts">${shown}</div>` : "";
  }

  function rowHtml(row) {
    const image = row.t ? `<img class="thumb" loading="lazy" src="${esc(row.t)}" alt="">` :
      (view.thumbnails ? '<div class="thumb none"></div>' : "");
    const k = view.values.indexOf(controls.value.value);
    const d = view.sides.length === 2 && k >= 0 ?
      ` · ${esc(view.values[k])} A − B <b>${signed(row.v[k][0] - row.v[k][1])}</b>` : "";
    const pair = row.p ? ` · seed ${esc(row.p)}` : "";
    const refs = row.r.length ? `<details class="refs"><summary>${row.r.length} references` +
      "</summary><ul>" + row.r.map((r) => `<li>${esc(r)}</li>`).join("") + "</ul></details>" :
      "";
    return `<article class="row" data-id="${row.id}">${image}<div class="body">` +
      `<div class="head">image ${row.id}${pair}${d}</div>` +
      row.c.map((_, s) => side(row, s)).join("") + refs + scores(row) + pictures(row) +
      "</div></article>";
  }

  function addRows() {
    const next = order.slice(shown, shown + PAGE);
    list.insertAdjacentHTML("beforeend", next.map(rowHtml).join(""));
    shown += next.length;
    more.hidden = shown >= order.length;
    more.textContent = `show ${Math.min(PAGE, order.length - shown)} more of ` +
      `${order.length - shown}`;
    document.documentElement.dataset.shown = String(shown);
  }

  // -- wiring -------------------------------------------------------------------------------
  function viewChanged() {
    view = data.views[Number(controls.view.value)];
    view.thumbnails = view.rows.some((row) => row.t);
    fillValues(controls.value.value);
    document.body.classList.toggle("two", view.sides.length === 2);
    $("view-note").textContent = view.note || "";
  }

  function changed() {
    writeState();
    select();
  }

  controls.view.innerHTML = data.views.map(
    (v, k) => `<option value="${k}">${esc(v.name)}</option>`).join("");
  $("view-box").hidden = data.views.length < 2;
  readState();
  viewChanged();
  controls.view.addEventListener("change", () => { viewChanged(); changed(); });
  controls.value.addEventListener("change", changed);
  controls.filter.addEventListener("change", changed);
  controls.flip.addEventListener("change", changed);
  let typing = 0;
  controls.q.addEventListener("input", () => {
    clearTimeout(typing);
    typing = setTimeout(changed, 150);
  });
  window.addEventListener("hashchange", () => { readState(); viewChanged(); select(); });
  more.addEventListener("click", addRows);
  if ("IntersectionObserver" in window) {
    new IntersectionObserver((seen) => {
      if (seen.some((e) => e.isIntersecting) && shown < order.length) addRows();
    }, {rootMargin: "600px"}).observe(sentinel);
  }
  select();
  document.documentElement.dataset.renderMs = performance.now().toFixed(1);
})();
