/* The oasis console: draws each page from its JSON (embedded in the page, and fetched
 * again from the page's /api/ twin when a live event says something changed).
 * Written for this project; no library, nothing loaded from the network. Text from the
 * daemon is set with textContent, never as HTML. */
(function () {
  "use strict";

  var body = document.body;
  var page = body.dataset.page;
  var api = body.dataset.api;
  // the path of [web] public_url ("/oasis" behind a proxy's path, else ""): every URL begins with it
  var base = body.dataset.base || "";
  var app = document.getElementById("app");
  var dataNode = document.getElementById("data");
  if (!app || !dataNode) return;
  var csrfMeta = document.querySelector('meta[name="csrf"]');
  var csrf = csrfMeta ? csrfMeta.getAttribute("content") : "";
  var data = JSON.parse(dataNode.textContent);
  var SVG = "http://www.w3.org/2000/svg";

  // -- small helpers -------------------------------------------------------------------

  function el(tag, attrs) {
    var node = document.createElement(tag);
    setAttrs(node, attrs);
    for (var i = 2; i < arguments.length; i++) add(node, arguments[i]);
    return node;
  }
  function svg(tag, attrs) {
    var node = document.createElementNS(SVG, tag);
    setAttrs(node, attrs);
    for (var i = 2; i < arguments.length; i++) add(node, arguments[i]);
    return node;
  }
  function setAttrs(node, attrs) {
    if (!attrs) return;
    Object.keys(attrs).forEach(function (k) {
      var v = attrs[k];
      if (v === null || v === undefined || v === false) return;
      if (k === "text") node.textContent = String(v);
      else if (k === "class") node.setAttribute("class", v);
      else node.setAttribute(k, v === true ? "" : String(v));
    });
  }
  function add(node, child) {
    if (child === null || child === undefined || child === false) return;
    if (Array.isArray(child)) { child.forEach(function (c) { add(node, c); }); return; }
    node.appendChild(typeof child === "string" ? document.createTextNode(child) : child);
  }
  function num(x, digits) {
    if (x === null || x === undefined) return "–";
    if (!isFinite(x)) return String(x);
    var a = Math.abs(x);
    if (a !== 0 && (a < 0.001 || a >= 1e6)) return x.toExponential(2);
    // below 1, three significant digits: a unit price of 0.0022 is not "0"
    if (a !== 0 && a < 1 && digits === undefined) return x.toLocaleString("en-US", { maximumSignificantDigits: 3 });
    return x.toLocaleString("en-US", { maximumFractionDigits: digits === undefined ? 2 : digits });
  }
  function pct(x) { return x === null || x === undefined ? "–" : (100 * x).toFixed(x > 0 && x < 0.01 ? 1 : 0) + "%"; }
  // a length of time in slots' terms, exact as the CLI's format_duration: every unit
  // (101 slots of 15m are 1d1h15m; two units alone showed "1d1h", a slot short)
  function duration(seconds) {
    if (!isFinite(seconds)) return "–";
    var rest = Math.abs(seconds), out = [];
    [["d", 86400], ["h", 3600], ["m", 60]].forEach(function (u) {
      var n = Math.floor(rest / u[1] + 1e-9);
      if (n) { out.push(n + u[0]); rest = Math.max(0, rest - n * u[1]); }
    });
    var s = Math.round(rest * 1000) / 1000;
    if (s > 0 || !out.length) out.push(s + "s");
    return (seconds < 0 ? "-" : "") + out.join("");
  }
  // a measured or estimated length: its two largest units, rounded to the second
  function roughly(seconds) {
    if (!isFinite(seconds)) return "–";
    var units = [86400, 3600, 60, 1], i = 0;
    while (i < units.length - 1 && Math.abs(seconds) < units[i]) i++;
    var step = units[Math.min(i + 1, units.length - 1)];
    return duration(Math.round(seconds / step) * step);
  }
  function slotStart(clock, slot) { return new Date((clock.epoch + slot * clock.slot_seconds) * 1000); }
  function when(clock, slot) {
    // to the second, up, as the ISO times next to it (a slot's start reads as in that slot)
    var d = new Date(Math.ceil(slotStart(clock, slot).getTime() / 1000) * 1000);
    // short slots (tests, demos), or a time with seconds (slots of 90 s: 01:28:30)
    return localTime(d, clock.slot_seconds < 60 || (d.getTime() / 1000) % 60);
  }
  function localTime(d, seconds) {
    var now = Date.now();
    var opts = Math.abs(d - now) < 6 * 86400 * 1000
      ? { weekday: "short", hour: "2-digit", minute: "2-digit", hour12: false }
      : { year: "numeric", month: "2-digit", day: "2-digit", hour: "2-digit", minute: "2-digit", hour12: false };
    if (seconds) opts.second = "2-digit";
    // across a clock change, its zone (as the CLI): the hour repeated in autumn reads twice
    if (d.getTimezoneOffset() !== new Date(now).getTimezoneOffset()) opts.timeZoneName = "short";
    return d.toLocaleString("en-GB", opts);
  }
  // a time axis' label: the clock time, or the date when labels are a day or more apart
  function axisTime(clock, slot, step) {
    var d = slotStart(clock, slot), pad = function (n) { return (n < 10 ? "0" : "") + n; };
    if (clock.slot_seconds * step >= 86400) return pad(d.getDate()) + "/" + pad(d.getMonth() + 1);
    return pad(d.getHours()) + ":" + pad(d.getMinutes()) + (clock.slot_seconds < 60 ? ":" + pad(d.getSeconds()) : "");
  }
  // the browser's zone and its offset now: "Asia/Kolkata (UTC+05:30)"
  function zoneName() {
    var minutes = -new Date().getTimezoneOffset(), sign = minutes < 0 ? "-" : "+", m = Math.abs(minutes);
    var pad = function (n) { return (n < 10 ? "0" : "") + n; };
    var zone = "";
    try { zone = Intl.DateTimeFormat().resolvedOptions().timeZone || ""; } catch (e) { zone = ""; }
    var offset = "UTC" + sign + pad(Math.floor(m / 60)) + ":" + pad(m % 60);
    return zone ? zone + " (" + offset + ")" : offset;
  }
  // a moment the daemon gives as ISO UTC (an event's, a count's): local as the slots'
  // times, to the second, the ISO time on hover (the events' "at" read in UTC beside
  // their slot's local time: "(Mon 21:10) 2026-12-01T02:13:50Z" in New York)
  function instant(iso) {
    var d = new Date(iso);
    if (!iso || isNaN(d.getTime())) return iso;
    return el("time", { datetime: iso, title: iso, text: localTime(d, true) });
  }
  // an event's detail as JSON, its fractions to 6 significant digits as the CLI prints
  // them (a payoff read 99.04369147515077)
  function detailJSON(detail) {
    return JSON.stringify(detail, function (k, v) {
      return typeof v === "number" && isFinite(v) && !Number.isInteger(v) ? Number(v.toPrecision(6)) : v;
    });
  }
  function slotLabel(clock, slot) { return slot + " (" + when(clock, slot) + ")"; }
  function stateBadge(state) { return el("span", { class: "state state-" + state, text: state }); }
  // a job's page; the ids "." and ".." by query, as a browser takes them out of a path
  // (/jobs/.. is /): views.py job_path
  function jobHref(id, then) {
    if (id === "." || id === "..") return base + "/job" + (then || "") + "?id=" + id;
    return base + "/jobs/" + encodeURIComponent(id) + (then || "");
  }
  function jobLink(id) { return el("a", { href: jobHref(id), text: id }); }
  // a cancelled or failed job's plan was not carried out: its numbers were planned, never earned
  var ABANDONED = { cancelled: true, failed: true };
  // an admitted job whose plan changed since its decision (a server failed or was
  // cordoned, its work ran slow): its utility is its plan's now, its cost and payoff its
  // decision's, so utility - cost is not its payoff (oasis jobs marks it the same way)
  function replanned(j) {
    var u = j.utility, c = j.cost, p = j.payoff;
    if (ABANDONED[j.state] || u === null || c === null || p === null || u === undefined) return false;
    return Math.abs(p + c - u) > 1e-9 * Math.max(1, Math.abs(u));
  }
  function planned(x) {
    if (x === null || x === undefined) return "–";
    return el("span", { class: "not-earned", title: "planned at admission, not earned", text: num(x) + " (planned)" });
  }
  function section(title, id) {
    var s = el("section", { "aria-labelledby": id });
    s.appendChild(el("h2", { id: id, text: title }));
    return s;
  }
  function table(caption, headers, rows, cls) {
    var t = el("table", { class: cls || "" });
    if (caption) t.appendChild(el("caption", { text: caption }));
    var head = el("tr");
    headers.forEach(function (h) { head.appendChild(el("th", { scope: "col", text: h })); });
    t.appendChild(el("thead", null, head));
    var tb = el("tbody");
    rows.forEach(function (r) {
      var tr = el("tr");
      r.forEach(function (c, i) {
        var cell = el(i === 0 ? "th" : "td", i === 0 ? { scope: "row" } : null);
        add(cell, typeof c === "number" ? num(c) : (c === null || c === undefined ? "–" : c));
        tr.appendChild(cell);
      });
      tb.appendChild(tr);
    });
    t.appendChild(tb);
    return el("div", { class: "table-wrap", tabindex: "0", role: "region", "aria-label": caption || headers.join(", ") }, t);
  }
  // "1 worker-slot", "2 worker-slots"
  function counted(n, unit) { return n + " " + unit + (n === 1 ? "" : "s"); }
  function dl(pairs) {
    var d = el("dl", { class: "facts" });
    pairs.forEach(function (p) {
      if (p === null) return;
      d.appendChild(el("div", p[2] ? { class: p[2] } : null, el("dt", { text: p[0] }), el("dd", null, p[1])));
    });
    return d;
  }
  // a <select> named and labelled ``name`` of ``values``, ``chosen`` selected; ``any``: a
  // first option with the empty value
  function choice(name, values, chosen, any) {
    var select = el("select", { id: name, name: name }, any ? el("option", { value: "", text: any }) : null);
    values.forEach(function (v) {
      var o = el("option", { value: v, text: v });
      if (v === chosen) o.selected = true;
      select.appendChild(o);
    });
    return select;
  }
  function hiddenCsrf() { return el("input", { type: "hidden", name: "csrf", value: csrf }); }

  // Viridis (matplotlib's, perceptually uniform and readable with colour-blindness),
  // 9 stops interpolated in sRGB.
  var VIRIDIS = [[68, 1, 84], [71, 44, 122], [59, 81, 139], [44, 113, 142], [33, 144, 141],
    [39, 173, 129], [92, 200, 99], [170, 220, 50], [253, 231, 37]];
  function viridis(t) {
    t = Math.max(0, Math.min(1, t));
    var x = t * (VIRIDIS.length - 1), i = Math.min(Math.floor(x), VIRIDIS.length - 2), f = x - i;
    var a = VIRIDIS[i], b = VIRIDIS[i + 1];
    return "rgb(" + [0, 1, 2].map(function (k) { return Math.round(a[k] + f * (b[k] - a[k])); }).join(",") + ")";
  }
  // Okabe-Ito: eight colours told apart with every common colour-vision deficiency.
  var JOB_COLOURS = ["#0072B2", "#E69F00", "#009E73", "#CC79A7", "#56B4E9", "#D55E00", "#F0E442", "#000000"];
  // colours go to the jobs of a view in the order they first appear, so the first eight
  // are all different (a hash of the id would give neighbours the same colour)
  var jobColours = {}, nextColour = 0;
  function jobColour(id) {
    if (!(id in jobColours)) jobColours[id] = JOB_COLOURS[nextColour++ % JOB_COLOURS.length];
    return jobColours[id];
  }
  function inkOn(colour) { return colour === "#000000" || colour === "#0072B2" || colour === "#D55E00" ? "#fff" : "#000"; }

  // -- overview ------------------------------------------------------------------------

  function overview(d) {
    var out = [], c = d.clock, n = d.node;
    var clock = section("Slot", "h-slot");
    clock.appendChild(dl([
      ["Current slot", el("strong", { id: "current-slot", text: String(c.slot) })],
      ["Began", when(c, c.slot) + " (" + c.starts_at + ")"],
      ["Ends", when(c, c.slot + 1) + " (" + c.ends_at + ")"],
      ["Slot length", duration(c.slot_seconds)],
      ["Window ahead", c.window + " slots (" + duration(c.window * c.slot_seconds) + ")"],
      ["Times shown", "in this browser's time zone, " + zoneName()]
    ]));
    out.push(clock);
    var node = section("Node", "h-node");
    var leaders = n.role === "standby" && n.mqtt;  // the plane and its broker: the leader's
    var facts = [
      ["Role", n.role === "standalone" ? "standalone (no [ha])"
        : n.role + " (epoch " + n.epoch + ", lease confirmed " + n.lease_age_seconds.toFixed(1) + " s ago)"],
      ["Leader", n.role === "standby" ? (n.leader || "unknown") : "this node"],
      n.cannot_lead ? ["Takeover", el("span", { class: "bad", text: "cannot take over: " + n.cannot_lead })] : null,
      ["Health", el("span", { class: n.serving ? "ok" : "bad",
        text: n.serving ? "serving" : (n.role === "standby" ? "reads only (standby)" : "not serving") })],
      // as oasis status says it: why not, or why its writes fail (the on-call audit: a
      // sqlite3 shell holding the write lock failed every submission under "reachable")
      ["Store", el("span", { id: "store-state", class: n.store_up && !n.writes_refused && !n.writes_locked ? "ok" : "bad",
        text: !n.store_up ? "unreachable: no decision can be stored" + (n.store_down ? ": " + n.store_down : "")
          : n.writes_refused ? "refuses writes (no decision can be stored; reads go on): " + n.writes_refused
          : n.writes_locked ? "writes wait for a lock (no decision can be stored; reads go on): " + n.writes_locked
          : "reachable" })],
      ["Draining", n.draining ? "yes: stopping" : "no"],
      // a standby runs no execution plane: the leader's broker link is the one (before,
      // a healthy standby read "Broker: disconnected" and "off (no [mqtt])")
      ["Broker", leaders ? "the leader's (a standby runs no execution plane)"
        : el("span", { class: n.broker === "disconnected" ? "bad" : "", text: n.broker })],
      ["Execution plane", n.execution_plane ? "on (progress reported by agents)"
        : leaders ? "on the leader (a standby runs none)" : "off (no [mqtt])"]
    ];
    if (d.out_of_service) {  // operators only: cordoned or failed, from the next slot on
      var names = Object.keys(d.out_of_service);
      facts.push(["Servers out of service", el("span", { id: "out-of-service", class: names.length ? "bad" : "",
        text: names.length ? names.slice(0, 20).map(function (s) {
          var end = (d.cordoned_until || {})[s];  // a planned maintenance: when it is back
          return s + " (" + d.out_of_service[s] + (end ? " to slot " + end.last_slot + ", back " + when(d.clock, end.last_slot + 1) : "") + ")";
        }).join(", ") +
          (names.length > 20 ? " and " + (names.length - 20) + " more (oasis servers lists them)" : "") : "none" })]);
      var planned = Object.keys(d.cordons_planned || {});
      if (planned.length) {  // oasis cordon --from: in service until then
        facts.push(["Cordons planned", el("span", { id: "cordons-planned",
          text: planned.slice(0, 20).map(function (s) {
            var c = d.cordons_planned[s];
            return s + " (from slot " + c.from_slot + ", " + when(d.clock, c.from_slot) +
              (c.last_slot === null ? ", no end" : "; back " + when(d.clock, c.last_slot + 1)) + ")";
          }).join(", ") + (planned.length > 20 ? " and " + (planned.length - 20) + " more" : "") })]);
      }
    }
    node.appendChild(dl(facts));
    out.push(node);
    var unheard = agentsUnheard(d.agents_unheard);
    if (unheard) out.splice(0, 0, unheard);  // first: the jobs planned there do not run
    var jobs = section("Jobs per state", "h-jobs");
    var list = el("ul", { class: "counts" });
    Object.keys(d.jobs).forEach(function (s) {
      list.appendChild(el("li", null, el("a", { href: base + "/jobs?state=" + s, class: "count-link" },
        stateBadge(s), el("span", { class: "count", text: String(d.jobs[s]) }))));
    });
    jobs.appendChild(list);
    if (d.jobs_counted_at) {
      jobs.appendChild(el("p", { class: "muted" }, "Counted at ", instant(d.jobs_counted_at),
        "; recounted at most every " + d.jobs_max_age_seconds.toFixed(1) + " s."));
    }
    out.push(jobs);
    if (d.use) {
      var use = section("Use per resource", "h-use");
      use.appendChild(el("p", { class: "muted", text: "Share of the capacity of each kind of server in use: now (slot " +
        c.slot + "), and over the window ahead (slots " + d.first_slot + " .. " + (d.first_slot + c.window) + "). " +
        "The bars show the mean per group of slots." }));
      var rows = d.use.map(function (u) {
        return [u.resource + " (" + (u.kind === "ps" ? "PS servers" : "worker servers") + ")",
          pct(u.now), pct(u.window_mean), pct(u.window_peak), spark(u, c)];
      });
      use.appendChild(table("Use per resource", ["Resource", "Now", "Mean ahead", "Peak ahead", "Over the window"], rows, "use"));
      out.push(use);
    } else {
      out.push(el("p", { class: "muted", text: "The cluster's use, prices and plans are for operators." }));
    }
    return out;
  }

  // servers up whose agent was never heard or is silent past the heartbeat timeout:
  // oasis status's line, worded by the daemon (records.unheard_line); null: none
  function agentsUnheard(u) {
    if (!u || !u.count) return null;
    return el("p", { id: "agents-unheard", class: "bad", role: "alert", text: u.line });
  }

  // -- servers -------------------------------------------------------------------------

  function servers(d) {
    var out = [], per = 100;
    var unheard = agentsUnheard(d.agents_unheard);
    if (unheard) out.push(unheard);
    var first = (d.page - 1) * per + 1, last = first + d.servers.length - 1;
    out.push(el("p", { class: "muted", id: "servers-caption" },
      (d.servers.length ? "Servers " + first + "–" + last + " of " + d.servers_total : "No server") +
      "; state from the next slot; use of slot " + d.clock.slot + " against capacity; agent: when last heard" +
      (d.agents_watched ? " (counted while the daemon is connected to the broker)" : " (\u201c-\u201d: no agents watched: no [mqtt], or a standby)") +
      ", as of ", instant(d.clock.now), "."));
    out.push(serversPager(d));
    var rows = d.servers.map(function (s) {
      var timeout = d.agents_unheard ? d.agents_unheard.heartbeat_timeout_seconds : Infinity;  // silent past it: red too
      var agent = el("span", { class: s.agent_heard === false || s.agent_heard_seconds_ago > timeout ? "bad" : "", text: s.agent });
      var state = s.state;
      if (s.cordon) {
        // when, as the overview says it: its start's local time, and when the server is back
        state += " (cordon from slot " + slotLabel(d.clock, s.cordon.from_slot) +
          (s.cordon.until_slot === null ? ", no end" : " to slot " + (s.cordon.until_slot - 1) +
            ", back " + when(d.clock, s.cordon.until_slot)) +
          (s.cordon.by ? "; by " + s.cordon.by : "") + (s.cordon.reason ? ": " + s.cordon.reason : "") + ")";
      }
      return [s.name, s.kind, state, agent].concat(d.resources.map(function (r) {
        var cap = s.capacity[r] || 0;
        return cap ? num(s.used[r] || 0) + "/" + num(cap) : "–";
      }));
    });
    out.push(table("Servers", ["Server", "Kind", "State", "Agent"].concat(d.resources), rows, "servers"));
    out.push(serversPager(d));
    return out;
  }

  function serversPager(d) {
    var nav = el("nav", { class: "pager", "aria-label": "Server pages" });
    if (d.page > 1) nav.appendChild(el("a", { href: base + "/servers?page=" + (d.page - 1), text: "← Previous servers" }));
    nav.appendChild(el("span", { text: "page " + d.page + " of " + d.pages }));
    if (d.page < d.pages) nav.appendChild(el("a", { href: base + "/servers?page=" + (d.page + 1), text: "Next servers →" }));
    return nav;
  }

  function spark(u, clock) {
    var w = 160, h = 28, n = u.series.length || 1, bw = w / n;
    var s = svg("svg", { width: w, height: h, viewBox: "0 0 " + w + " " + h, role: "img", class: "spark",
      "aria-label": u.resource + " use over the window: from " + pct(u.series[0]) + " to " + pct(u.series[n - 1]) +
        ", peak " + pct(u.window_peak) });
    s.appendChild(svg("rect", { x: 0, y: 0, width: w, height: h, class: "spark-bg" }));
    u.series.forEach(function (v, i) {
      var bh = Math.max(v > 0 ? 1 : 0, v * h);
      var bar = svg("rect", { x: i * bw, y: h - bh, width: Math.max(bw - 0.5, 0.5), height: bh, class: "spark-bar" });
      bar.appendChild(svg("title", { text: "slots " + u.series_slots[i] + ".." + (u.series_slots[i + 1] - 1) + ": " + pct(v) }));
      s.appendChild(bar);
    });
    return s;
  }

  // -- prices (heatmap) ----------------------------------------------------------------

  var cursor = { row: 0, col: 0, shown: false };
  var cellCache = {};

  function prices(d) {
    var out = [];
    var form = el("form", { method: "get", action: base + "/prices", class: "controls" });
    form.appendChild(el("label", { for: "resource", text: "Resource" }));
    form.appendChild(choice("resource", d.resources, d.resource, null));
    form.appendChild(el("button", { type: "submit", text: "Show" }));
    form.appendChild(el("span", { class: "muted", text: d.chosen === "costliest"
      ? "Showing " + d.resource + ": the resource whose prices come closest to their top." : "" }));
    out.push(form);
    var binned = d.rows.length < d.servers || d.cols.length < d.slots;
    out.push(el("p", { class: "muted", id: "heat-caption", text:
      "Unit price of one " + d.resource + " per slot (utility per unit per slot), " + d.servers + " servers × " +
      d.slots + " slots from slot " + d.first_slot + (binned ? ", grouped into " + d.rows.length + " × " +
      d.cols.length + " cells (a cell's colour is its mean price; point at it for min and max)" : "") +
      ". Point at a cell, or focus the chart and use the arrow keys." }));
    out.push(legend(d));
    var wrap = el("div", { class: "heat-wrap" });
    var canvas = el("canvas", { id: "heatmap", tabindex: "0", role: "img",
      "aria-describedby": "heat-caption heat-tip", "data-rows": d.rows.length, "data-cols": d.cols.length,
      "aria-label": "Heatmap of " + d.resource + " unit prices, servers by slots" });
    var tip = el("div", { id: "heat-tip", class: "tip", role: "status", "aria-live": "polite", hidden: true });
    wrap.appendChild(canvas);
    wrap.appendChild(tip);
    out.push(wrap);
    requestAnimationFrame(function () { drawHeat(canvas, tip, d); });
    return out;
  }

  function legend(d) {
    var box = el("figure", { class: "legend", "aria-label": "Colour scale" });
    var w = 320, h = 14;
    var s = svg("svg", { width: w + 2, height: h + 2, viewBox: "0 0 " + (w + 2) + " " + (h + 2), role: "img",
      "aria-label": "Colour scale from the floor price (dark purple) to the top price (yellow), logarithmic" });
    var grad = svg("linearGradient", { id: "viridis" });
    for (var i = 0; i <= 8; i++) grad.appendChild(svg("stop", { offset: (i / 8 * 100) + "%", "stop-color": viridis(i / 8) }));
    s.appendChild(svg("defs", null, grad));
    s.appendChild(svg("rect", { x: 1, y: 1, width: w, height: h, fill: "url(#viridis)", stroke: "#444" }));
    box.appendChild(s);
    box.appendChild(el("figcaption", null,
      el("span", { class: "floor", text: "floor L = " + num(d.floor, 4) }),
      el("span", { class: "mid", text: "log scale" }),
      el("span", { class: "top-price", text: "top U = " + num(d.top, 4) })));
    return box;
  }

  function drawHeat(canvas, tip, d) {
    var wrapWidth = canvas.parentNode.clientWidth;
    var rows = d.rows.length, cols = d.cols.length;
    var left = Math.min(110, Math.max(60, wrapWidth * 0.22)), top = 34;
    var cw = Math.max(2, (wrapWidth - left - 4) / cols);
    var ch = Math.max(6, Math.min(26, 520 / rows));
    var width = Math.floor(left + cw * cols + 4), height = Math.ceil(top + ch * rows + 4);
    var ratio = window.devicePixelRatio || 1;
    canvas.width = width * ratio; canvas.height = height * ratio;
    canvas.style.width = width + "px"; canvas.style.height = height + "px";
    var g = canvas.getContext("2d");
    g.scale(ratio, ratio);
    g.fillStyle = "#fff"; g.fillRect(0, 0, width, height);
    for (var r = 0; r < rows; r++) {
      for (var c = 0; c < cols; c++) {
        g.fillStyle = viridis(d.level[r][c] / 255);
        g.fillRect(left + c * cw, top + r * ch, Math.ceil(cw), Math.ceil(ch));
      }
    }
    g.fillStyle = "#222"; g.font = "12px system-ui, sans-serif"; g.textBaseline = "middle"; g.textAlign = "right";
    var every = Math.max(1, Math.ceil(14 / ch));
    for (r = 0; r < rows; r += every) {
      g.fillText(fit(g, d.rows[r].label, left - 6), left - 6, top + r * ch + ch / 2);
    }
    g.textAlign = "left"; g.textBaseline = "alphabetic";
    var clock = d.clock, step = Math.max(1, Math.ceil(64 / cw)), lastEnd = -1;
    for (c = 0; c < cols; c += step) {
      var x = left + c * cw, label = String(d.cols[c].from);
      var stamp = axisTime(clock, d.cols[c].from, d.cols[Math.min(c + step, cols - 1)].from - d.cols[c].from || 1);
      // a label past the right edge was cut: slot 2993774 read 299377
      var w = Math.max(g.measureText(label).width, g.measureText(stamp).width);
      if (x < lastEnd || x + w > width) continue;
      g.fillText(label, x, 14);
      g.fillStyle = "#555"; g.fillText(stamp, x, 28); g.fillStyle = "#222";
      lastEnd = Math.max(x + 50, x + w + 6);
      g.fillRect(x, top - 4, 1, 4);
    }
    g.textAlign = "right"; g.fillStyle = "#555"; g.fillText("slot", left - 6, 14); g.fillText("time", left - 6, 28);
    var geometry = { left: left, top: top, cw: cw, ch: ch, rows: rows, cols: cols };
    canvas._geometry = geometry;
    if (cursor.shown) outline(g, geometry);

    function at(ev) {
      var rect = canvas.getBoundingClientRect();
      var cc = Math.floor((ev.clientX - rect.left - left) / cw), rr = Math.floor((ev.clientY - rect.top - top) / ch);
      return rr >= 0 && rr < rows && cc >= 0 && cc < cols ? { row: rr, col: cc } : null;
    }
    canvas.onmousemove = function (ev) {
      var p = at(ev);
      if (!p) { tip.hidden = true; return; }
      cursor.row = p.row; cursor.col = p.col;
      showTip(tip, d, p, ev.clientX - canvas.getBoundingClientRect().left, ev.clientY - canvas.getBoundingClientRect().top);
    };
    canvas.onmouseleave = function () { if (!cursor.shown) tip.hidden = true; };
    canvas.onkeydown = function (ev) {
      var moves = { ArrowUp: [-1, 0], ArrowDown: [1, 0], ArrowLeft: [0, -1], ArrowRight: [0, 1], Home: [0, -cols], End: [0, cols] };
      var m = moves[ev.key];
      if (!m) return;
      ev.preventDefault();
      cursor.row = Math.max(0, Math.min(rows - 1, cursor.row + m[0]));
      cursor.col = Math.max(0, Math.min(cols - 1, cursor.col + m[1]));
      cursor.shown = true;
      drawHeat(canvas, tip, d);
    };
    canvas.onfocus = function () { if (!cursor.shown) { cursor.shown = true; drawHeat(canvas, tip, d); } };
    canvas.onblur = function () {
      if (!canvas.isConnected) return;  // replaced by a redraw: its successor takes the focus
      cursor.shown = false; tip.hidden = true; drawHeat(canvas, tip, d);
    };
    if (cursor.shown) showTip(tip, d, cursor, left + (cursor.col + 1) * cw, top + (cursor.row + 1) * ch);
  }

  function outline(g, geo) {
    g.lineWidth = 2; g.strokeStyle = "#e4007c";
    g.strokeRect(geo.left + cursor.col * geo.cw - 1, geo.top + cursor.row * geo.ch - 1, geo.cw + 2, geo.ch + 2);
  }

  function fit(g, text, width) {
    if (g.measureText(text).width <= width) return text;
    while (text.length > 1 && g.measureText(text + "…").width > width) text = text.slice(0, -1);
    return text + "…";
  }

  function showTip(tip, d, p, x, y) {
    var row = d.rows[p.row], col = d.cols[p.col], clock = d.clock;
    var slots = col.to - col.from === 1 ? "slot " + slotLabel(clock, col.from)
      : "slots " + col.from + ".." + (col.to - 1) + " (" + when(clock, col.from) + " – " + when(clock, col.to) + ")";
    var lines = [
      el("strong", { text: row.label + (row.servers > 1 ? " (" + row.servers + " servers)" : "") }),
      el("span", { text: slots }),
      el("span", { class: "tip-price", text: "unit price …" }),
      el("span", { class: "tip-use", text: "use " + d.use[p.row][p.col] + "% of capacity" })
    ];
    var priceLine = lines[2], useLine = lines[3];
    var jobsLine = el("span", { class: "tip-jobs", text: "jobs: …" });
    lines.push(jobsLine);
    tip.replaceChildren.apply(tip, lines);
    tip.hidden = false;
    var wrapW = tip.parentNode.clientWidth;
    tip.style.left = Math.max(0, Math.min(x + 12, wrapW - 260)) + "px";
    tip.style.top = (y + 12) + "px";
    var key = [d.resource, row.from, row.to, col.from, col.to].join("/");
    var fill = function (cell) {
      if (!cell) { jobsLine.textContent = "jobs: (could not read)"; priceLine.textContent = "unit price: (could not read)"; return; }
      priceLine.textContent = "unit price " + num(cell.price_mean, 4) + (cell.price_min !== cell.price_max
        ? " (mean; min " + num(cell.price_min, 4) + ", max " + num(cell.price_max, 4) + ")" : "");
      useLine.textContent = "use " + pct(cell.use) + " of capacity";
      if (!cell.jobs.length) { jobsLine.textContent = "jobs: none"; return; }
      jobsLine.textContent = "jobs: " + cell.jobs.map(function (j) {
        return j.id + " (" + (j.worker_slots ? counted(j.worker_slots, "worker-slot") : counted(j.ps_slots, "PS-slot")) + ")";
      }).join(", ") + (cell.more_jobs ? " and " + cell.more_jobs + " more" : "");
    };
    if (cellCache[key]) { fill(cellCache[key]); return; }
    var q = base + "/api/prices/cell?resource=" + encodeURIComponent(d.resource) + "&r0=" + row.from + "&r1=" + row.to +
      "&s0=" + col.from + "&s1=" + col.to;
    fetch(q, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (cell) { if (cell) cellCache[key] = cell; fill(cell); })
      .catch(function () { fill(null); });
  }

  // -- plans (Gantt) -------------------------------------------------------------------

  function plans(d) {
    var out = [], clock = d.clock;
    jobColours = {}; nextColour = 0;
    var form = el("form", { method: "get", action: base + "/plans", class: "controls" });
    form.appendChild(el("label", { for: "plan-job", text: "Job id" }));
    form.appendChild(el("input", { id: "plan-job", name: "job", value: d.job || "", spellcheck: "false", size: 24 }));
    form.appendChild(el("button", { type: "submit", text: "Show its servers" }));
    if (d.job) form.appendChild(el("a", { href: base + "/plans", text: "All servers" }));
    out.push(form);
    if (d.job && !d.servers.length) {  // rejected, cancelled, done or waiting: no chart to draw
      out.push(el("p", { class: "muted", id: "plan-caption" }, "Job " + d.job + " is planned on no server in slots " +
        d.first_slot + " .. " + (d.first_slot + d.slots - 1) + " (from " + when(clock, d.first_slot) + "); ",
        el("a", { href: jobHref(d.job), text: "its page" }), " says why."));
      return out;
    }
    var first = (d.page - 1) * 40 + 1, last = first + d.servers.length - 1;
    out.push(el("p", { class: "muted", id: "plan-caption", text: (d.job ? "Servers job " + d.job + " uses: " : "") +
      (d.servers.length ? "servers " + first + "–" + last + " of " + d.servers_total : "no server") +
      ", slots " + d.first_slot + " .. " + (d.first_slot + d.slots - 1) + " (from " + when(clock, d.first_slot) + ", " +
      duration(clock.slot_seconds) + " each). Jobs on a server get their own lanes where their times overlap; a bar's number is its workers (W) or " +
      "parameter servers (PS); striped bars are PS. Select a bar to open its job." }));
    out.push(pager(d));
    if (d.servers.length) {
      out.push(el("div", { class: "gantt-wrap" }, gantt(d)));
      out.push(jobKey(d));
    }
    out.push(pager(d));
    return out;
  }

  function pager(d) {
    var nav = el("nav", { class: "pager", "aria-label": "Server pages" });
    var here = base + "/plans?" + (d.job ? "job=" + encodeURIComponent(d.job) + "&" : "");
    if (d.page > 1) nav.appendChild(el("a", { href: here + "page=" + (d.page - 1), text: "← Previous servers" }));
    nav.appendChild(el("span", { text: "page " + d.page + " of " + d.pages }));
    if (d.page < d.pages) nav.appendChild(el("a", { href: here + "page=" + (d.page + 1), text: "Next servers →" }));
    return nav;
  }

  function jobKey(d) {
    var seen = {}, order = [];
    d.servers.forEach(function (server) {
      server.jobs.forEach(function (job) {
        if (!seen[job.id]) { seen[job.id] = 0; order.push(job.id); }
        seen[job.id] += 1;
      });
    });
    var box = section("Jobs on these servers", "h-key");
    if (!order.length) { box.appendChild(el("p", { class: "muted", text: "None: these servers are idle over the window." })); return box; }
    var list = el("ul", { class: "job-key" });
    order.forEach(function (id) {
      var swatch = el("span", { class: "swatch" });
      swatch.style.background = jobColour(id);  // CSSOM: the CSP allows no style attribute
      list.appendChild(el("li", null, swatch,
        jobLink(id), el("span", { class: "muted", text: " on " + seen[id] + " server" + (seen[id] > 1 ? "s" : "") })));
    });
    box.appendChild(list);
    return box;
  }

  function gantt(d) {
    var clock = d.clock, width = Math.max(320, app.clientWidth);
    var left = width < 600 ? 56 : 90, top = 36, lane = 18, gap = 6;
    var sw = (width - left - 4) / d.slots;
    // jobs whose times on a server do not overlap share a lane (first fit, by start)
    var lanesOf = d.servers.map(function (server) {
      var ends = [];
      return server.jobs.map(function (job) {
        var from = job.bars[0][0], to = job.bars[job.bars.length - 1][1];
        for (var i = 0; i < ends.length; i++) {
          if (ends[i] < from) { ends[i] = to; return i; }
        }
        ends.push(to);
        return ends.length - 1;
      });
    });
    var rowsH = lanesOf.map(function (lanes) { return Math.max(1, Math.max.apply(null, lanes.concat([0])) + 1) * lane + gap; });
    var height = top + rowsH.reduce(function (a, b) { return a + b; }, 0) + 4;
    var s = svg("svg", { width: width, height: height, viewBox: "0 0 " + width + " " + height, class: "gantt",
      role: "group", "aria-label": "Plan per server over the window" });
    var defs = svg("defs");
    var pat = svg("pattern", { id: "ps-stripes", width: 6, height: 6, patternUnits: "userSpaceOnUse", patternTransform: "rotate(45)" });
    pat.appendChild(svg("rect", { width: 6, height: 6, fill: "#fff", "fill-opacity": "0.0" }));
    pat.appendChild(svg("line", { x1: 0, y1: 0, x2: 0, y2: 6, stroke: "#fff", "stroke-width": 2.5, "stroke-opacity": 0.6 }));
    defs.appendChild(pat);
    s.appendChild(defs);
    var step = Math.max(1, Math.ceil(56 / sw)), lastEnd = -1;
    for (var i = 0; i < d.slots; i += step) {
      // about 7 px a character at 11 px; a label past the right edge was cut (2993786 read 2)
      var x = left + i * sw, w = 7 * Math.max(String(d.first_slot + i).length, 5) + 4;
      if (x < lastEnd || x + w > width) continue;
      lastEnd = x + w;
      s.appendChild(svg("text", { x: x, y: 13, class: "axis", text: String(d.first_slot + i) }));
      s.appendChild(svg("text", { x: x, y: 28, class: "axis muted", text: axisTime(clock, d.first_slot + i, step) }));
      s.appendChild(svg("line", { x1: x, y1: top - 4, x2: x, y2: height, class: "grid" }));
    }
    var y = top;
    d.servers.forEach(function (server, k) {
      var h = rowsH[k];
      s.appendChild(svg("rect", { x: 0, y: y - gap / 2, width: width, height: h, class: k % 2 ? "row-odd" : "row-even" }));
      s.appendChild(svg("text", { x: left - 6, y: y + lane / 2 + 4, class: "server", "text-anchor": "end",
        text: server.name.length > (left / 7.5) ? server.name.slice(0, Math.floor(left / 7.5) - 1) + "…" : server.name },
        svg("title", { text: server.name + " (" + (server.kind === "ps" ? "PS server" : "worker server") + ")" })));
      if (!server.jobs.length) {
        s.appendChild(svg("text", { x: left + 4, y: y + lane / 2 + 4, class: "idle", text: "idle over the window" }));
      }
      server.jobs.forEach(function (job, j) {
        var colour = jobColour(job.id), ly = y + lanesOf[k][j] * lane;
        var link = svg("a", { href: jobHref(job.id), class: "bar-link", "data-job": job.id,
          "aria-label": "job " + job.id + " on " + server.name });
        job.bars.forEach(function (b) {
          var bx = left + (b[0] - d.first_slot) * sw, bwid = Math.max(2, (b[1] - b[0] + 1) * sw - 1);
          var isPs = b[3] > 0 && !b[2];
          var label = isPs ? b[3] + " PS" : b[2] + " W";
          var title = "job " + job.id + ": " + (isPs ? b[3] + " parameter server" + (b[3] > 1 ? "s" : "") : b[2] + " worker" + (b[2] > 1 ? "s" : "")) +
            " on " + server.name + ", slots " + b[0] + ".." + b[1] + " (" + when(clock, b[0]) + " – " + when(clock, b[1] + 1) + ")";
          var g = svg("g", { class: "bar" });
          g.appendChild(svg("title", { text: title }));
          g.appendChild(svg("rect", { x: bx, y: ly + 1, width: bwid, height: lane - 3, rx: 2, fill: colour, stroke: "#fff", "stroke-width": 1, class: d.job === job.id ? "bar-rect picked" : "bar-rect" }));
          if (isPs) g.appendChild(svg("rect", { x: bx, y: ly + 1, width: bwid, height: lane - 3, rx: 2, fill: "url(#ps-stripes)" }));
          var text = bwid > 64 ? job.id.slice(0, Math.floor((bwid - 34) / 6.5)) + " " + label : (bwid > 26 ? label : "");
          if (text) g.appendChild(svg("text", { x: bx + 3, y: ly + lane / 2 + 3, class: "bar-text", fill: inkOn(colour), text: text }));
          link.appendChild(g);
        });
        s.appendChild(link);
      });
      y += h;
    });
    return s;
  }

  // -- jobs ----------------------------------------------------------------------------

  function jobs(d) {
    var out = [], clock = d.clock;
    var form = el("form", { method: "get", action: base + "/jobs", class: "controls", role: "search" });
    form.appendChild(el("label", { for: "state", text: "State" }));
    form.appendChild(choice("state", d.states, d.state, "all states"));
    form.appendChild(el("label", { for: "q", text: "Id starts with" }));
    form.appendChild(el("input", { id: "q", name: "q", type: "search", value: d.q || "", spellcheck: "false", size: 20 }));
    form.appendChild(el("button", { type: "submit", text: "Filter" }));
    out.push(form);
    if (!d.jobs.length) {
      out.push(el("p", { class: "empty", text: "No job matches" + (d.state ? " in state " + d.state : "") + (d.q ? " with an id starting " + d.q : "") + "." }));
    } else {
      var rows = d.jobs.map(function (j) {
        var row = [jobLink(j.id), stateBadge(j.state), String(j.submitted_slot), slotLabel(clock, j.arrival_slot)];
        if (ABANDONED[j.state]) return row.concat(["–", planned(j.planned && j.planned.utility), planned(j.cost), planned(j.payoff)]);
        // a completion slot's time is its end, as on the job's page and in oasis jobs
        var done = j.completion_slot === null ? "–" : j.completion_slot + " (" + when(clock, j.completion_slot + 1) + ")";
        if (replanned(j)) return row.concat([done, num(j.utility) + "*", j.cost, j.payoff]);
        return row.concat([done, j.utility, j.cost, j.payoff]);
      });
      out.push(table("Jobs in decision order", ["Job", "State", "Submitted (slot)", "Arrives", "Completes (slot)",
        "Utility", "Cost", "Payoff"], rows, "jobs"));
      if (d.jobs.some(replanned)) out.push(el("p", { class: "muted", id: "replanned-note", text:
        "* re-planned since its admission: cost and payoff are the decision's, utility the plan's now (the job's events say why)." }));
    }
    var nav = el("nav", { class: "pager", "aria-label": "Job pages" });
    var here = base + "/jobs?" + (d.state ? "state=" + d.state + "&" : "") + (d.q ? "q=" + encodeURIComponent(d.q) + "&" : "");
    if (d.after > 0) nav.appendChild(el("a", { href: here.replace(/&$/, "").replace(/\?$/, ""), text: "← First page" }));
    if (d.next_after !== null) nav.appendChild(el("a", { href: here + "after=" + d.next_after, rel: "next", text: "Next page →" }));
    out.push(nav);
    return out;
  }

  // -- job -----------------------------------------------------------------------------

  function job(d) {
    var out = [], j = d.job, dec = j.decision, clock = d.clock;
    var head = el("div", { class: "job-head" }, stateBadge(j.state));
    if (d.can_cancel) {
      var form = el("form", { method: "post", action: jobHref(j.id, "/cancel"), class: "cancel" });
      form.appendChild(hiddenCsrf());
      form.appendChild(el("button", { type: "submit", class: "danger", id: "cancel", text: "Cancel this job" }));
      head.appendChild(form);
    }
    out.push(head);
    var decision = section("Decision", "h-decision");
    var gone = ABANDONED[j.state], plan = j.planned;
    var moved = replanned({ state: j.state, utility: dec.utility, cost: dec.cost, payoff: dec.payoff });
    var byEnd = function (slot) { return "by the end of slot " + slot + " (" + when(clock, slot + 1) + ")"; };
    var slots = function (n) { return n + (n === 1 ? " slot (" : " slots (") + duration(n * clock.slot_seconds) + ")"; };
    decision.appendChild(dl([
      ["Admitted", dec.admitted ? "yes" : "no"],
      gone ? ["Utility", plan ? "none earned (" + num(plan.utility) + " planned)" : "–"]
        : ["Utility", moved ? num(dec.utility) + " as re-planned (its events say why); admitted with " + num(dec.payoff + dec.cost)
          : num(dec.utility)],
      ["Cost", gone ? planned(dec.cost) : num(dec.cost) + (moved ? " (at admission)" : "")],
      ["Payoff", gone ? planned(dec.payoff) : num(dec.payoff) + (moved ? " (at admission)" : "")],
      ["Arrives", slotLabel(clock, dec.arrival_slot)],
      gone ? ["Ran until", dec.completion_slot === null ? "never ran" : "the end of slot " + dec.completion_slot + " (" + when(clock, dec.completion_slot + 1) + ")"]
        : ["Completes", dec.completion_slot === null ? "–" : byEnd(dec.completion_slot)],
      gone ? (plan ? ["Planned", byEnd(plan.completion_slot) + ", completion time " + slots(plan.jct) + "; not carried out"] : null)
        : ["Completion time", dec.jct === null ? "–" : slots(dec.jct)],
      ["Work", counted(dec.work, "worker-slot")],
      ["Submitted in slot", String(j.submitted_slot)],
      j.wait_until_slot === null ? null : ["Waits until", "slot " + slotLabel(clock, j.wait_until_slot)],
      ["Decided in", num(dec.decision_ms, 1) + " ms"],
      dec.reason ? ["Why", el("span", { class: "reason", text: dec.reason }), "wide"] : null
    ]));
    out.push(decision);
    if (dec.price_drivers && dec.price_drivers.length) {
      var drivers = section("What priced it out", "h-drivers");
      drivers.appendChild(table("The costliest parts of the best schedule", ["Resource", "Server", "Slots", "Cost", "Unit price up to"],
        dec.price_drivers.map(function (p) {
          return [p.resource, p.server, p.first_slot + ".." + p.last_slot + " (" + when(clock, p.first_slot) + ")", p.cost, p.price];
        })));
      out.push(drivers);
    }
    out.push(specSection(j.spec));
    var plan = section("Plan per slot", "h-plan");
    if (!d.plan.length) plan.appendChild(el("p", { class: "muted", text: "No slot is planned for this job." }));
    else {
      plan.appendChild(table("Workers and parameter servers per slot", ["Slot", "Workers", "Parameter servers"],
        d.plan.map(function (p) {
          return [slotLabel(clock, p.slot), placement(p.workers), placement(p.ps)];
        }), "plan"));
      if (d.can_see_plans) {  // a submitter is refused the plans page: no link to it
        plan.appendChild(el("p", null, el("a", { href: base + "/plans?job=" + encodeURIComponent(j.id), text: "See it in the plans (Gantt chart)" })));
      }
    }
    out.push(plan);
    out.push(progressSection(d.progress, clock));
    var events = section("Events", "h-events");
    if (!d.events.length) events.appendChild(el("p", { class: "muted", text: "No event yet." }));
    else events.appendChild(table("Events of this job, oldest first", ["#", "Kind", "State", "Slot", "At", "Detail"],
      d.events.map(function (e) {
        return [String(e.sequence), e.kind, e.state ? stateBadge(e.state) : "–", e.slot === null ? "–" : slotLabel(clock, e.slot), instant(e.at),
          el("code", { text: detailJSON(e.detail) })];
      }), "events"));
    out.push(events);
    return out;
  }

  function placement(map) {
    var names = Object.keys(map);
    return names.length ? names.map(function (n) { return n + " × " + map[n]; }).join(", ") : "–";
  }

  var SPEC_LABELS = {
    id: "Id", epochs: "Epochs", chunks: "Chunks (data parts)", minibatches: "Mini-batches per chunk",
    minibatch_seconds: "One mini-batch (seconds)", tau: "One mini-batch (slots)", grad_mb: "Gradient size (MB)",
    worker: "Each worker needs", ps: "Each parameter server needs", utility: "Utility"
  };
  function specSection(spec) {
    var s = section("Spec", "h-spec");
    var known = Object.keys(SPEC_LABELS);
    var keys = known.filter(function (k) { return k in spec; })
      .concat(Object.keys(spec).filter(function (k) { return known.indexOf(k) < 0; }));
    var pairs = keys.map(function (k) {
      var v = spec[k];
      var shown = v !== null && typeof v === "object"
        ? Object.keys(v).map(function (kk) { return kk + " " + (typeof v[kk] === "object" ? JSON.stringify(v[kk]) : v[kk]); }).join(", ")
        : String(v);
      return [SPEC_LABELS[k] || k, shown];
    });
    s.appendChild(dl(pairs));
    // an operator sees a tenant's job by its key, alice:train-1, which is no id to submit
    var sendable = Object.assign({}, spec);
    if (typeof sendable.id === "string" && sendable.id.indexOf(":") >= 0) sendable.id = sendable.id.split(":").pop();
    var details = el("details", null, el("summary", { text: "As JSON (what oasis submit reads)" }),
      el("pre", { text: JSON.stringify(sendable, null, 2) }));
    s.appendChild(details);
    return s;
  }

  function progressSection(p, clock) {
    var s = section("Progress against plan", "h-progress");
    if (!p || !p.available) {
      s.appendChild(el("p", { class: "muted", text: "Not reported: " + (p ? p.why : "unknown") + "." }));
      return s;
    }
    var done = p.worker_seconds, planned = p.planned_worker_seconds, est = p.total_worker_seconds;
    var rows = [
      ["Mini-batches", num(p.minibatches_done, 0) + " of " + p.minibatches_total + " (" + pct(p.minibatches_total ? p.minibatches_done / p.minibatches_total : 0) + ")"],
      ["Worker time used", roughly(done) + " of " + roughly(planned) + " planned"],
      ["Estimated in all", roughly(est.mean) + " (" + Math.round(100 * est.level) + "% interval " + roughly(est.low) + " – " + roughly(est.high) + ", from " + p.reports + " reports)"],
      ["One mini-batch", num(p.minibatch_seconds.mean, 3) + " s estimated (plan " + num(p.planned_minibatch_seconds, 3) + " s)"]
    ];
    // as the agents last said: the worker commands failing on each server, and why
    (p.worker_failures || []).forEach(function (f) {
      var times = f.failures === 1 ? "once" : num(f.failures, 0) + " times";
      rows.push(["Workers failing on " + f.server, times + (f.last_failure ? ", last: " + f.last_failure : "") +
        " (" + roughly(f.seconds_ago) + " ago)"]);
    });
    s.appendChild(dl(rows));
    var w = 520, h = 74, pad = 10;
    var max = Math.max(planned, est.high || 0, done, 1) * 1.05;
    var x = function (v) { return pad + (w - 2 * pad) * Math.min(v, max) / max; };
    var chart = svg("svg", { width: "100%", viewBox: "0 0 " + w + " " + h, class: "progress", role: "img",
      "aria-label": "Worker time: " + roughly(done) + " used; plan " + roughly(planned) + "; estimate " + roughly(est.mean) +
        " between " + roughly(est.low) + " and " + roughly(est.high) });
    chart.appendChild(svg("rect", { x: pad, y: 14, width: x(planned) - pad, height: 16, class: "planned" }));
    chart.appendChild(svg("rect", { x: pad, y: 14, width: x(done) - pad, height: 16, class: "done" }));
    chart.appendChild(svg("rect", { x: x(est.low), y: 38, width: Math.max(1, x(est.high) - x(est.low)), height: 10, class: "interval" }));
    chart.appendChild(svg("line", { x1: x(est.mean), x2: x(est.mean), y1: 34, y2: 52, class: "estimate" }));
    chart.appendChild(svg("line", { x1: x(planned), x2: x(planned), y1: 8, y2: 56, class: "plan-line" }));
    chart.appendChild(svg("text", { x: pad, y: 68, class: "axis", text: "0" }));
    chart.appendChild(svg("text", { x: x(planned), y: 68, class: "axis", "text-anchor": "middle", text: "plan " + roughly(planned) }));
    s.appendChild(chart);
    s.appendChild(el("p", { class: "legend-line" },
      el("span", { class: "key key-done" }), "used so far  ",
      el("span", { class: "key key-planned" }), "planned  ",
      el("span", { class: "key key-interval" }), "estimate's interval (tick: its mean)"));
    return s;
  }

  // -- drawing, and live updates -------------------------------------------------------

  var renderers = { overview: overview, servers: servers, prices: prices, plans: plans, jobs: jobs, job: job };

  function render() {
    var active = document.activeElement, key = active && active.id;
    app.replaceChildren.apply(app, [].concat(renderers[page](data)));
    if (key) { var again = document.getElementById(key); if (again && again !== active) again.focus(); }
  }

  if (!renderers[page]) return;
  render();
  // after the drawings queued by render (heatmap): bench/console.py times this mark
  requestAnimationFrame(function () { if (window.performance && performance.mark) performance.mark("oasis-drawn"); });

  var live = document.getElementById("live");
  var pending = null, lastFetch = 0, lastEvent = 0;
  function refresh() {
    pending = null; lastFetch = Date.now();
    fetch(api, { headers: { Accept: "application/json" }, credentials: "same-origin" })
      .then(function (r) { return r.ok ? r.json() : null; })
      .then(function (fresh) { if (fresh) { data = fresh; cellCache = {}; render(); recount(); } })
      .catch(function () {});
  }
  // the overview's counts are shared and recounted at most every jobs_max_age_seconds:
  // counts older than the last event are fetched again once they may be recounted
  function recount() {
    if (page !== "overview" || pending || !data.jobs_max_age_seconds) return;
    var counted = lastFetch - 1000 * data.jobs_age_seconds;
    if (lastEvent <= counted) return;
    pending = setTimeout(refresh, Math.max(700, counted + 1000 * data.jobs_max_age_seconds + 50 - Date.now()));
  }
  function relevant(ev) {
    if (page === "job") return ev.job_id === data.job.id;
    return true;
  }
  if (window.EventSource) {
    var stream = new EventSource(base + "/api/events");
    stream.onopen = function () { if (live) { live.textContent = "● live"; live.className = "live on"; } };
    stream.onerror = function () {
      if (!live) return;
      live.className = "live off";
      // a refusal (too many streams open: 429 or 503; a session that ended: 401) closes
      // the stream for good; the browser reconnects by itself only after a cut
      if (stream.readyState === EventSource.CLOSED) {
        live.textContent = "not updating: reload the page";
        live.setAttribute("title", "the live event stream was refused (too many open, or logged out)");
      } else live.textContent = "reconnecting…";
    };
    stream.addEventListener("oasis", function (e) {
      var ev = JSON.parse(e.data);
      if (live) live.setAttribute("title", "last event: " + ev.kind + " " + (ev.job_id || "") + " (#" + ev.sequence + ")");
      if (!relevant(ev)) return;
      lastEvent = Date.now();
      if (pending) return;
      pending = setTimeout(refresh, Math.max(0, 700 - (Date.now() - lastFetch)));
    });
    window.addEventListener("beforeunload", function () { stream.close(); });
  }
  // an agent's silence grows without an event: with agents watched, the servers page
  // and the overview are read again every 15 s
  setInterval(function () {
    if ((page === "servers" || page === "overview") && data.agents_unheard && !pending && !document.hidden) refresh();
  }, 15000);
  var resizeTimer = null;
  window.addEventListener("resize", function () {
    if (page !== "prices" && page !== "plans") return;
    clearTimeout(resizeTimer);
    resizeTimer = setTimeout(render, 150);
  });
})();
