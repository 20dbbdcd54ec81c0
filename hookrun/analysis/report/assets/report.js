// hookrun report: draws the page's data (the JSON block "hookrun-data") with plotly.js.
// Every element is made with createElement and filled with textContent: no data becomes markup.
(function () {
  "use strict";
  const data = JSON.parse(document.getElementById("hookrun-data").textContent);
  const PNG = "data:image/png;base64,";

  function el(tag, cls, text) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    if (text !== undefined && text !== null) e.textContent = String(text);
    return e;
  }

  function plot(parent, fig, caption) {
    const box = el("div", "fig");
    if (fig.layout && fig.layout.width) box.style.width = fig.layout.width + "px"; // a wide figure (the circuit) keeps its width
    const div = el("div", "plot");
    box.appendChild(div);
    if (caption) box.appendChild(el("div", "caption", caption));
    parent.appendChild(box);
    Plotly.newPlot(div, fig.data, fig.layout, { displaylogo: false, displayModeBar: false, responsive: true });
    return div;
  }

  function table(parent, columns, rows) {
    const t = el("table");
    if (columns.some((c) => c !== "")) {
      const head = el("tr");
      columns.forEach((c) => head.appendChild(el("th", null, c)));
      t.appendChild(head);
    }
    rows.forEach((r) => {
      const tr = el("tr");
      r.forEach((v) => tr.appendChild(el("td", typeof v === "number" ? "num" : null, v === null ? "" : v)));
      t.appendChild(tr);
    });
    parent.appendChild(t);
    return t;
  }

  function tokens(parent, ex, max) {
    const line = el("div", "example");
    line.dataset.value = String(ex.value);
    line.dataset.sample = String(ex.sample);
    line.appendChild(el("span", "val", ex.value.toPrecision(4)));
    line.appendChild(el("span", "meta", "#" + ex.sample + (ex.position === null ? "" : " @" + ex.position)));
    if (ex.context === null && typeof ex.src === "string" && ex.src.startsWith(PNG)) {
      const img = el("img", "example-map");
      img.src = ex.src;
      img.alt = "sample #" + ex.sample + ": the channel's map over its image";
      line.appendChild(img);
    } else if (ex.context === null && ex.position !== null && ex.position !== undefined) {
      line.appendChild(el("span", "tok at", "(sample #" + ex.sample + ", position " + ex.position + "; no input_ids stored)"));
    } else if (ex.context === null) {
      line.appendChild(el("span", "tok at", "(image sample #" + ex.sample + ")"));
    } else {
      ex.context.forEach((t, i) => {
        const s = el("span", i === ex.at ? "tok at" : "tok", t);
        const v = ex.acts ? ex.acts[i] : i === ex.at ? ex.value : null;
        if (v !== null && v !== undefined) {
          s.dataset.act = String(v);
          const a = max > 0 ? Math.max(0, Math.min(1, v / max)) : 0;
          if (a > 0) s.style.background = "rgba(255, 140, 0, " + a.toFixed(3) + ")";
          s.title = "activation " + v;
        }
        line.appendChild(s);
      });
    }
    parent.appendChild(line);
  }

  function latents(parent, item) {
    const wrap = el("div", "latents");
    const side = el("div", "latent-list");
    const search = el("input");
    search.type = "search";
    search.placeholder = "latent number or token text";
    const list = el("ul");
    const detail = el("div", "latent-detail");
    side.appendChild(search);
    side.appendChild(list);
    wrap.appendChild(side);
    wrap.appendChild(detail);
    parent.appendChild(wrap);
    const rows = [];
    function show(f, li) {
      rows.forEach((r) => r.li.classList.remove("active"));
      li.classList.add("active");
      detail.replaceChildren();
      detail.dataset.feature = String(f.feature);
      detail.appendChild(el("h3", null, item.module + " · latent " + f.feature));
      if (f.decoder_norm !== undefined) detail.appendChild(el("div", "caption", "decoder norm " + f.decoder_norm.toPrecision(4)));
      detail.appendChild(el("div", "caption", "top " + f.examples.length + " examples, largest first (value, sample @ position, context)"));
      const box = el("div", "examples");
      f.examples.forEach((ex) => tokens(box, ex, f.max));
      detail.appendChild(box);
      if (f.hist) plot(detail, f.hist);
    }
    item.features.forEach((f) => {
      const li = el("li", null, "latent " + f.feature + "  (max " + f.max.toPrecision(3) + ")");
      li.dataset.feature = String(f.feature);
      const words = f.examples.map((e) => (e.context || []).join("")).join(" ").toLowerCase();
      rows.push({ li: li, key: String(f.feature), words: words });
      li.addEventListener("click", () => show(f, li));
      list.appendChild(li);
    });
    search.addEventListener("input", () => {
      const q = search.value.trim().toLowerCase();
      rows.forEach((r) => { r.li.style.display = !q || r.key === q || r.words.includes(q) ? "" : "none"; });
    });
    if (item.features.length) show(item.features[0], rows[0].li);
  }

  const kinds = {
    kv: (p, it) => table(p, ["", ""], it.rows).classList.add("kv"),
    pre: (p, it) => {
      const d = el("details");
      d.appendChild(el("summary", null, it.title || ""));
      d.appendChild(el("pre", null, it.text));
      p.appendChild(d);
    },
    table: (p, it) => table(p, it.columns, it.rows),
    figure: (p, it) => plot(p, it.figure, it.caption),
    figures: (p, it) => {
      p.appendChild(el("h3", null, it.title));
      const g = el("div", "figs");
      p.appendChild(g);
      it.figures.forEach((f) => plot(g, f.figure, f.caption));
    },
    images: (p, it) => {
      p.appendChild(el("h3", null, it.title));
      const g = el("div", "thumbs");
      it.images.forEach((im) => {
        if (typeof im.src !== "string" || !im.src.startsWith(PNG)) return;
        const f = el("figure");
        const img = el("img");
        img.src = im.src;
        img.alt = im.caption;
        f.appendChild(img);
        f.appendChild(el("figcaption", null, im.caption));
        g.appendChild(f);
      });
      p.appendChild(g);
    },
    latents: (p, it) => {
      p.appendChild(el("h3", null, it.title));
      latents(p, it);
    },
  };

  document.getElementById("title").textContent = data.title;
  const nav = document.getElementById("nav");
  const main = document.getElementById("main");
  data.sections.forEach((s) => {
    const sec = el("section");
    sec.id = "section-" + s.id;
    sec.appendChild(el("h2", null, s.title));
    if (s.note) sec.appendChild(el("p", "note", s.note));
    main.appendChild(sec);
    const a = el("a", null, s.title);
    a.href = "#section-" + s.id;
    nav.appendChild(a);
    s.items.forEach((it) => {
      const draw = kinds[it.type];
      if (draw) draw(sec, it);
      else console.warn("hookrun report: no drawer for", it.type);
    });
  });
  document.body.dataset.ready = "1";
})();
