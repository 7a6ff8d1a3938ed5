// mailroom's page script: the live list, the split pane, the buttons, the checks, the shortcuts.
// No build step, no inline script (the page's CSP allows only this file). Everything that comes from
// a message is put in the page with textContent, never as markup; the HTML part stays in its
// sandboxed frame. A button whose API route this server lacks (404/405 from the router, no MR code)
// is hidden: the page degrades quietly.
(function () {
  "use strict";
  var root = document.getElementById("inbox");
  var csrfMeta = document.querySelector('meta[name="csrf-token"]');
  var csrf = csrfMeta ? csrfMeta.content : "";
  var status = document.getElementById("status");

  function say(msg) { if (status) { status.textContent = ""; status.textContent = msg; } }
  function el(tag, cls, value) {
    var x = document.createElement(tag);
    if (cls) x.className = cls;
    if (value != null) x.textContent = value;
    return x;
  }
  function enc(s) { return encodeURIComponent(s); }
  function boxApi(address, path) { return "/api/v1/mailboxes/" + enc(address) + (path || ""); }
  function pageUrl(address, path) { return "/inbox/" + enc(address) + (path || ""); }

  // fetch with the page's cookie and CSRF header; resolves {status, ok, body, missing}
  // missing: the route does not exist on this server (the router's 404/405 carry no MR code)
  function call(method, url, body) {
    var opts = {method: method, credentials: "same-origin", headers: {"X-CSRF-Token": csrf}};
    if (body !== undefined) { opts.headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(body); }
    return fetch(url, opts).then(function (r) {
      return r.text().then(function (t) {
        var doc = null;
        try { doc = t ? JSON.parse(t) : null; } catch (err) { doc = null; }
        var code = doc && doc.error ? doc.error.code : "";
        return {status: r.status, ok: r.ok, body: doc,
                missing: (r.status === 404 || r.status === 405) && !code,
                message: doc && doc.detail ? doc.detail : ("HTTP " + r.status)};
      });
    }, function () { return {status: 0, ok: false, body: null, missing: false, message: "network error"}; });
  }

  // ---- time: the browser's local time, the ISO time on hover; one format for every row ----
  var fmt = null;
  try { fmt = new Intl.DateTimeFormat(undefined, {dateStyle: "medium", timeStyle: "short"}); } catch (err) { fmt = null; }
  function localTime(iso) {
    var d = new Date(iso);
    if (isNaN(d.getTime())) return iso || "";
    return fmt ? fmt.format(d) : d.toLocaleString();
  }
  function timeEl(iso) {
    var t = el("time", "", localTime(iso));
    t.setAttribute("datetime", iso || ""); t.title = iso || "";
    return t;
  }
  function localize(scope) {
    (scope || document).querySelectorAll("time[datetime]").forEach(function (t) {
      if (t.dataset.local) return;
      t.textContent = localTime(t.getAttribute("datetime")); t.dataset.local = "1";
    });
  }
  localize();

  // ---- the expiry's countdown and "extend" ----
  var expires = document.getElementById("expires");
  function left(ms) {
    if (ms <= 0) return "expired";
    var s = Math.floor(ms / 1000), d = Math.floor(s / 86400), h = Math.floor(s % 86400 / 3600),
      m = Math.floor(s % 3600 / 60), sec = s % 60;
    if (d) return "expires in " + d + "d " + h + "h";
    if (h) return "expires in " + h + "h " + m + "m";
    return "expires in " + m + "m " + (sec < 10 ? "0" : "") + sec + "s";
  }
  function tick() {
    if (!expires) return;
    var iso = expires.dataset.expires, t = expires.querySelector("time");
    if (!expires.dataset.ticking) {  // "expires <ISO>" from the server becomes the countdown
      t = t || timeEl(iso); expires.textContent = ""; expires.appendChild(t); expires.dataset.ticking = "1";
    }
    t.setAttribute("datetime", iso);
    t.title = "expires " + localTime(iso) + " (" + iso + ")";
    t.textContent = left(new Date(iso).getTime() - Date.now());
  }
  if (expires) { tick(); setInterval(tick, 1000); }
  var extend = document.getElementById("extend");
  if (extend && root) {
    extend.addEventListener("click", function () {
      var max = Number(extend.dataset.maxTtl) || 0;
      var ttl = max ? Math.min(max, 86400) : 3600;
      extend.disabled = true;
      call("POST", boxApi(root.dataset.address, "/extend"), {ttl_seconds: ttl}).then(function (r) {
        extend.disabled = false;
        if (r.missing) { extend.hidden = true; return; }
        if (!r.ok) { say(r.message); window.alert(r.message); return; }
        expires.dataset.expires = r.body.expires_at; tick(); say("extended to " + localTime(r.body.expires_at));
      });
    });
  }

  // ---- copy buttons: the value is in data-copy ----
  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("button[data-copy]");
    if (!b) return;
    var done = function () { b.textContent = "Copied"; b.dataset.copied = "1"; say("copied"); };
    var fallback = function () {
      var t = document.createElement("textarea"); t.value = b.dataset.copy; document.body.appendChild(t);
      t.select(); try { document.execCommand("copy"); } catch (err) { /* nothing more to try */ } t.remove(); done();
    };
    if (navigator.clipboard && navigator.clipboard.writeText) navigator.clipboard.writeText(b.dataset.copy).then(done, fallback);
    else fallback();
  });

  // ---- delete buttons of the inbox and of a message ----
  document.addEventListener("click", function (ev) {
    var b = ev.target.closest("button[data-delete]");
    if (!b) return;
    var article = b.closest("#message");
    var address = article ? article.dataset.address : root.dataset.address;
    if (!window.confirm(b.dataset.confirm || "Delete?")) return;
    call("DELETE", boxApi(address, b.dataset.delete)).then(function (r) {
      if (!r.ok) { window.alert(r.message); return; }
      if (article && paneEl && paneEl.contains(article)) { removeRows([Number(article.dataset.id)]); clearPane(); }
      else window.location = b.dataset.then;
    });
  });

  // ---- help dialog ----
  var help = document.getElementById("help");
  function toggleHelp() {
    if (!help || !help.showModal) return;
    if (help.open) help.close(); else help.showModal();
  }
  var helpButton = document.getElementById("show-help");
  if (helpButton) helpButton.addEventListener("click", toggleHelp);

  // ---- the message: tabs, preview widths, images, raw, checks, release, tags ----
  function checkTable(headers, rows) {
    var table = el("table", "kv"), head = el("thead"), tr = el("tr");
    headers.forEach(function (h) { var th = el("th", "", h); th.scope = "col"; tr.appendChild(th); });
    head.appendChild(tr); table.appendChild(head);
    var body = el("tbody");
    rows.forEach(function (cells) {
      var r = el("tr");
      cells.forEach(function (c) {
        var td = el("td");
        if (c && c.nodeType) td.appendChild(c); else td.textContent = c == null ? "" : String(c);
        r.appendChild(td);
      });
      body.appendChild(r);
    });
    table.appendChild(body);
    return table;
  }
  function verdict(ok, yes, no) { return el("span", ok ? "ok" : "bad", ok ? yes : no); }
  var renderCheck = {
    html: function (doc) {
      var box = el("div");
      box.appendChild(el("p", "", "Score " + doc.score + "/100 over " + doc.clients + " email clients (" + doc.source + ")"));
      box.appendChild(checkTable(["Feature", "Kind", "Supported", "Partial", "Unsupported", "Notes"],
        (doc.features || []).map(function (f) {
          return [f.name, f.kind, f.supported, f.partial, f.unsupported, (f.notes || []).join("; ")];
        })));
      return box;
    },
    links: function (doc) {
      var box = el("div");
      box.appendChild(el("p", "", doc.checked + " checked, " + doc.skipped + " skipped"));
      box.appendChild(checkTable(["URL", "Kind", "Status", "Redirects", "Result"], (doc.links || []).map(function (l) {
        return [l.url, l.kind, l.status == null ? "—" : l.status, l.redirects, verdict(l.ok, "ok", l.error || "failed")];
      })));
      return box;
    },
    spam: function (doc) {
      var box = el("div"), p = el("p");
      p.appendChild(el("strong", "", "Score " + doc.score + " (threshold " + doc.threshold + ") "));
      p.appendChild(verdict(!doc.is_spam, "not spam", "spam"));
      box.appendChild(p);
      box.appendChild(checkTable(["Rule", "Score", "Description"], (doc.rules || []).map(function (r) {
        return [r.name, r.score, r.description];
      })));
      return box;
    }
  };
  function loadCheck(article, panel) {
    if (panel.dataset.loaded) return;
    panel.dataset.loaded = "1";
    call("GET", article.dataset.base + "/checks/" + panel.dataset.check).then(function (r) {
      panel.textContent = "";
      if (r.missing) { panel.appendChild(el("p", "muted", "This check is not available on this server.")); return; }
      if (!r.ok) { panel.appendChild(el("p", "muted", r.message)); return; }
      panel.appendChild(renderCheck[panel.dataset.check](r.body));
    });
  }
  function loadRaw(pre) {
    if (pre.dataset.loaded) return;
    pre.dataset.loaded = "1";
    fetch(pre.dataset.src, {credentials: "same-origin"}).then(function (r) { return r.text(); })
      .then(function (t) { pre.textContent = t; }, function () { pre.textContent = "could not load"; });
  }
  function loadRelease(article, panel) {
    if (panel.dataset.loaded) return;
    panel.dataset.loaded = "1";
    var form = panel.querySelector("#release-form"), select = form.querySelector("select");
    call("GET", "/api/v1/release").then(function (r) {
      if (r.missing || !r.ok || !r.body.enabled) {
        form.hidden = true;
        panel.appendChild(el("p", "muted", r.missing ? "Release is not available on this server." :
          (r.ok ? "Release is off on this server." : r.message)));
        return;
      }
      (r.body.senders || []).forEach(function (s) { var o = el("option", "", s); o.value = s; select.appendChild(o); });
    });
    form.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var out = panel.querySelector("#release-result");
      call("POST", article.dataset.base + "/release", {to: form.elements.to.value, sender: select.value || null})
        .then(function (r) {
          out.textContent = r.ok ? "Queued as outbound message " + r.body.outbound_id + " to " + r.body.to + " from " + r.body.sender
            : "Refused: " + r.message;
          out.className = r.ok ? "ok" : "bad";
        });
    });
  }
  function selectTab(article, key) {
    article.querySelectorAll('[role="tab"]').forEach(function (t) {
      var on = t.dataset.tab === key;
      t.setAttribute("aria-selected", on ? "true" : "false"); t.tabIndex = on ? 0 : -1;
    });
    article.querySelectorAll('[role="tabpanel"]').forEach(function (p) {
      var on = p.id === "panel-" + key;
      p.hidden = !on;
      if (!on) return;
      if (p.dataset.check) loadCheck(article, p);
      var raw = p.querySelector("#raw"); if (raw) loadRaw(raw);
      if (key === "release") loadRelease(article, p);
    });
  }
  function renderTags(article, tags) {
    article.dataset.tags = JSON.stringify(tags);
    var box = article.querySelector("#msg-tags"); box.textContent = "";
    tags.forEach(function (t) {
      var a = el("span", "tag", t), x = el("button", "ghost small", "×");
      x.type = "button"; x.setAttribute("aria-label", "remove tag " + t); x.dataset.untag = t;
      a.appendChild(x); box.appendChild(a);
    });
  }
  function patchMessage(address, id, change) {
    return call("PATCH", boxApi(address, "/messages/" + id), change);
  }
  function initMessage(article) {
    if (!article) return;
    localize(article);
    article.querySelectorAll('[role="tab"]').forEach(function (t) {
      t.addEventListener("click", function () { selectTab(article, t.dataset.tab); });
      t.addEventListener("keydown", function (ev) {
        if (ev.key !== "ArrowRight" && ev.key !== "ArrowLeft") return;
        var tabs = Array.prototype.filter.call(article.querySelectorAll('[role="tab"]'), function (x) { return !x.hidden; });
        var i = tabs.indexOf(t) + (ev.key === "ArrowRight" ? 1 : -1);
        var next = tabs[(i + tabs.length) % tabs.length]; selectTab(article, next.dataset.tab); next.focus();
      });
    });
    var frame = article.querySelector("#html-frame");
    article.querySelectorAll("button[data-width]").forEach(function (b) {
      b.addEventListener("click", function () {
        frame.style.width = b.dataset.width ? b.dataset.width + "px" : "100%";
        article.querySelectorAll("button[data-width]").forEach(function (x) { x.setAttribute("aria-pressed", String(x === b)); });
      });
    });
    var images = article.querySelector("#show-images");
    if (images) images.addEventListener("click", function () { frame.src = frame.dataset.src + "?images=1"; images.remove(); });
    var address = article.dataset.address, id = Number(article.dataset.id);
    var row = document.getElementById("m" + id);
    if (row && row.classList.contains("unread")) setRead(row, true);  // reading marked it read
    renderTags(article, JSON.parse(article.dataset.tags || "[]"));
    var tagForm = article.querySelector("#tag-form");
    function setTags(tags) {
      patchMessage(address, id, {tags: tags}).then(function (r) {
        if (r.missing) { tagForm.hidden = true; return; }
        if (!r.ok) { window.alert(r.message); return; }
        renderTags(article, r.body.tags || tags);
        var listRow = document.getElementById("m" + id); if (listRow) updateRow(listRow, r.body);
      });
    }
    tagForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var t = tagForm.elements.tag.value.trim().toLowerCase(); if (!t) return;
      var tags = JSON.parse(article.dataset.tags || "[]");
      if (tags.indexOf(t) < 0) tags.push(t);
      tagForm.elements.tag.value = ""; setTags(tags.sort());
    });
    article.addEventListener("click", function (ev) {
      var x = ev.target.closest("button[data-untag]"); if (!x) return;
      setTags(JSON.parse(article.dataset.tags || "[]").filter(function (t) { return t !== x.dataset.untag; }));
    });
    var unread = article.querySelector("#mark-unread");
    unread.addEventListener("click", function () {
      patchMessage(address, id, {is_read: false}).then(function (r) {
        if (r.missing) { unread.hidden = true; return; }
        if (!r.ok) { window.alert(r.message); return; }
        var listRow = document.getElementById("m" + id); if (listRow) setRead(listRow, false);
        unread.textContent = "Marked unread"; say("marked unread");
      });
    });
    // a route this server lacks: its tab is hidden (the HTML check, release) once probed
    var releaseTab = article.querySelector("#tab-release");
    if (releaseTab) call("GET", "/api/v1/release").then(function (r) { if (r.missing) releaseTab.hidden = true; });
  }
  initMessage(document.querySelector("#message"));

  // ---- the list: rows, selection, actions ----
  var list = document.getElementById("messages") || document.getElementById("results");
  var paneEl = document.getElementById("pane");
  var split = document.getElementById("split");
  var current = null;
  function rows() { return list ? Array.prototype.slice.call(list.querySelectorAll("li.msg")) : []; }
  function setRead(row, read) {
    row.classList.toggle("unread", !read);
    var dot = row.querySelector(".dot"), sr = row.querySelector(".from .sr-only");
    if (read) { if (dot) dot.remove(); if (sr) sr.remove(); }
    else if (!dot) {
      var from = row.querySelector(".from"), d = el("span", "dot"); d.title = "unread";
      from.insertBefore(el("span", "sr-only", "unread, "), from.firstChild); from.insertBefore(d, from.firstChild);
    }
  }
  function tagLinks(box, tags, address) {
    tags.forEach(function (t) {
      var a = el("a", "tag", t);
      a.href = root.dataset.view === "all" ? "/mail?tag=" + enc(t) : pageUrl(address, "?q=" + enc("tag:" + t));
      a.dataset.tag = t; box.appendChild(a);
    });
  }
  function updateRow(row, m) {
    if (m.is_read != null) setRead(row, m.is_read);
    if (m.tags) {
      row.dataset.tags = JSON.stringify(m.tags);
      var box = row.querySelector(".tags"); box.querySelectorAll(".tag").forEach(function (t) { t.remove(); });
      tagLinks(box, m.tags, row.dataset.mailbox);
    }
  }
  // the same markup as page.message_row
  function buildRow(m, address, showMailbox) {
    var li = el("li", m.is_read === false ? "msg unread" : "msg");
    li.id = "m" + m.id; li.dataset.id = m.id; li.dataset.mailbox = address; li.dataset.tags = JSON.stringify(m.tags || []);
    var subject = m.subject || "(no subject)";
    var pick = el("input", "pick"); pick.type = "checkbox"; pick.setAttribute("aria-label", "select “" + subject + "”");
    li.appendChild(pick);
    var body = el("div", "body"), a = el("a", "open"); a.href = pageUrl(address, "/messages/" + m.id);
    var line1 = el("span", "line1"), from = el("span", "from", m.from || m.envelope_from);
    if (m.is_read === false) {
      from.insertBefore(el("span", "sr-only", "unread, "), from.firstChild);
      var d = el("span", "dot"); d.title = "unread"; from.insertBefore(d, from.firstChild);
    }
    line1.appendChild(from); line1.appendChild(timeEl(m.received_at)); a.appendChild(line1);
    var subj = el("span", "subject", subject);
    var n = m.attachment_count || (m.has_attachments ? 1 : 0);
    if (n) {
      var clip = el("span", "mark", "📎" + n); clip.title = n + " attachment(s)";
      clip.appendChild(el("span", "sr-only", " attachment(s)"));
      subj.insertBefore(document.createTextNode(" "), subj.firstChild); subj.insertBefore(clip, subj.firstChild);
    }
    a.appendChild(subj); a.appendChild(el("span", "snippet", m.snippet || ""));
    body.appendChild(a);
    var tags = el("span", "tags");
    if (showMailbox) { tags.appendChild(el("span", "mailbox-of", address)); tags.appendChild(document.createTextNode(" ")); }
    tagLinks(tags, m.tags || [], address);
    body.appendChild(tags); li.appendChild(body);
    return li;
  }
  function removeRows(ids) {
    ids.forEach(function (id) {
      var r = document.getElementById("m" + id);
      if (r) { if (r === current) current = null; r.remove(); }
    });
    var count = document.getElementById("count");
    if (count) count.textContent = String(Math.max(0, Number(count.textContent) - ids.length));
    updateToolbar();
  }
  function clearPane() {
    if (!paneEl) return;
    paneEl.textContent = ""; paneEl.appendChild(el("p", "empty", "Select a message"));
  }
  function wide() { return window.matchMedia("(min-width: 960px)").matches; }
  function openRow(row) {
    if (!row) return;
    setCurrent(row);
    var url = pageUrl(row.dataset.mailbox, "/messages/" + row.dataset.id);
    if (!paneEl || !wide()) { window.location = url; return; }
    fetch(url + "?pane=1", {credentials: "same-origin"}).then(function (r) {
      return r.text().then(function (t) { return {ok: r.ok, text: t}; });
    }).then(function (r) {
      // the server's own escaped markup of the message (the HTML part stays in its sandboxed frame)
      paneEl.innerHTML = r.ok ? r.text : "";
      if (!r.ok) paneEl.appendChild(el("p", "empty", "This message is gone."));
      initMessage(paneEl.querySelector("#message"));
    });
  }
  function setCurrent(row) {
    if (current) current.classList.remove("current");
    current = row;
    if (row) { row.classList.add("current"); row.scrollIntoView({block: "nearest"}); }
  }
  function picked() {
    return rows().filter(function (r) { return r.querySelector(".pick").checked; });
  }
  var toolbar = document.getElementById("toolbar");
  function updateToolbar() {
    if (!toolbar) return;
    var n = picked().length;
    toolbar.querySelectorAll("button[data-act]").forEach(function (b) { b.disabled = n === 0; });
  }
  function byMailbox(selected) {
    var groups = {};
    selected.forEach(function (r) { (groups[r.dataset.mailbox] = groups[r.dataset.mailbox] || []).push(Number(r.dataset.id)); });
    return groups;
  }
  function act(kind) {
    var selected = picked();
    if (!selected.length) return;
    if (kind === "delete") {
      if (!window.confirm("Delete " + selected.length + " message(s)?")) return;
      var groups = byMailbox(selected);
      Object.keys(groups).forEach(function (address) {
        call("POST", boxApi(address, "/messages/delete"), {ids: groups[address]}).then(function (r) {
          if (r.missing) {  // this server has no bulk delete: one DELETE each
            groups[address].forEach(function (id) {
              call("DELETE", boxApi(address, "/messages/" + id)).then(function (x) { if (x.ok) removeRows([id]); });
            });
            return;
          }
          if (!r.ok) { window.alert(r.message); return; }
          removeRows(groups[address]); say(r.body.deleted + " deleted");
        });
      });
      return;
    }
    var tagName = (document.getElementById("tag-name").value || "").trim().toLowerCase();
    if ((kind === "tag" || kind === "untag") && !tagName) { document.getElementById("tag-name").focus(); return; }
    selected.forEach(function (row) {
      var change;
      if (kind === "read" || kind === "unread") change = {is_read: kind === "read"};
      else {
        var tags = JSON.parse(row.dataset.tags || "[]").filter(function (t) { return t !== tagName; });
        if (kind === "tag") tags.push(tagName);
        change = {tags: tags.sort()};
      }
      patchMessage(row.dataset.mailbox, row.dataset.id, change).then(function (r) {
        if (r.missing) { toolbar.querySelectorAll('[data-act="read"],[data-act="unread"],[data-act="tag"],[data-act="untag"]')
          .forEach(function (b) { b.hidden = true; }); return; }
        if (!r.ok) { say(r.message); return; }
        updateRow(row, r.body);
      });
    });
  }
  if (list) {
    list.addEventListener("click", function (ev) {
      var row = ev.target.closest("li.msg");
      if (!row) return;
      if (ev.target.classList.contains("pick")) { updateToolbar(); return; }
      var a = ev.target.closest("a.open");
      if (a && paneEl && wide() && !ev.ctrlKey && !ev.metaKey && !ev.shiftKey) { ev.preventDefault(); openRow(row); }
    });
    list.addEventListener("change", updateToolbar);
  }
  if (toolbar) {
    toolbar.addEventListener("click", function (ev) {
      var b = ev.target.closest("button[data-act]"); if (b) act(b.dataset.act);
    });
    var all = document.getElementById("pick-all");
    all.addEventListener("change", function () {
      rows().forEach(function (r) { r.querySelector(".pick").checked = all.checked; }); updateToolbar();
    });
  }
  var deleteAll = document.getElementById("delete-all");
  if (deleteAll) {
    deleteAll.addEventListener("click", function () {
      if (!window.confirm("Delete every message of this inbox? The inbox stays.")) return;
      call("DELETE", boxApi(root.dataset.address, "/messages")).then(function (r) {
        if (r.missing) { deleteAll.hidden = true; say("delete all is not available on this server"); return; }
        if (!r.ok) { window.alert(r.message); return; }
        removeRows(rows().map(function (x) { return Number(x.dataset.id); }));
        var count = document.getElementById("count"); if (count) count.textContent = "0";
        clearPane(); say(r.body.deleted + " deleted");
      });
    });
  }

  // ---- fault injection (the inbox header) ----
  var faultForm = document.getElementById("fault-form");
  var faultBadge = document.getElementById("fault-badge");
  function showFault(f) {
    if (!faultBadge) return;
    if (!f || f.active === false) { faultBadge.hidden = true; faultBadge.textContent = ""; return; }
    var how = f.remaining != null ? ", next " + f.remaining : (f.share != null && f.share !== 100 ? ", " + f.share + "% of messages" : "");
    faultBadge.textContent = "⚠ " + (f.scope ? f.scope + " " : "") + "fault at " + f.stage + ": " + f.reply + how;
    faultBadge.hidden = false;
  }
  if (faultForm && root && root.dataset.address) {
    var faultUrl = boxApi(root.dataset.address, "/fault");
    call("GET", faultUrl).then(function (r) { if (r.missing) document.getElementById("fault").hidden = true; });
    faultForm.addEventListener("submit", function (ev) {
      ev.preventDefault();
      var f = faultForm.elements;
      var body = {stage: f.stage.value, reply: f.reply.value, share: Number(f.share.value || 100),
                  count: f.count.value ? Number(f.count.value) : null};
      call("PUT", faultUrl, body).then(function (r) {
        if (r.missing) { document.getElementById("fault").hidden = true; return; }
        if (!r.ok) { window.alert(r.message); return; }
        showFault(r.body); say("fault set");
      });
    });
    document.getElementById("fault-clear").addEventListener("click", function () {
      call("DELETE", faultUrl).then(function (r) {
        if (r.ok) { showFault(null); say("fault cleared"); } else if (!r.missing) window.alert(r.message);
      });
    });
  }

  // ---- notifications: asked on a click, never on load ----
  var notify = document.getElementById("notify");
  function notifyLabel() {
    if (!notify) return;
    if (!("Notification" in window)) { notify.hidden = true; return; }
    notify.textContent = Notification.permission === "granted" ? "Notifications on" : "Notify me";
    notify.disabled = Notification.permission !== "default";
  }
  notifyLabel();
  if (notify) notify.addEventListener("click", function () {
    var p = Notification.requestPermission(notifyLabel); if (p && p.then) p.then(notifyLabel);
  });
  function notifyNew(m) {
    if (!("Notification" in window) || Notification.permission !== "granted") return;
    try { new Notification(m.subject || "(no subject)", {body: "From " + (m.from || m.envelope_from || ""), tag: "mailroom-" + m.id}); }
    catch (err) { /* a browser that allows notifications only from a service worker */ }
  }

  // ---- keyboard shortcuts ----
  document.addEventListener("keydown", function (ev) {
    var t = ev.target;
    if (ev.ctrlKey || ev.metaKey || ev.altKey) return;
    if (t && (t.tagName === "INPUT" || t.tagName === "TEXTAREA" || t.tagName === "SELECT" || t.isContentEditable)) {
      if (ev.key === "Escape") t.blur();
      return;
    }
    if (ev.key === "?") { ev.preventDefault(); toggleHelp(); return; }
    if (ev.key === "/") {
      var s = document.getElementById("search");
      if (s) { ev.preventDefault(); s.focus(); s.select(); }
      return;
    }
    var all = rows();
    if (!all.length) return;
    var i = current ? all.indexOf(current) : -1;
    if (ev.key === "j" || ev.key === "k") {
      ev.preventDefault();
      setCurrent(all[Math.max(0, Math.min(all.length - 1, i + (ev.key === "j" ? 1 : -1)))] || all[0]);
    } else if ((ev.key === "o" || ev.key === "Enter") && current && !(t && t.closest && t.closest("button,a"))) {
      ev.preventDefault(); openRow(current);
    } else if (ev.key === "x" && current) {
      var box = current.querySelector(".pick"); box.checked = !box.checked; updateToolbar();
    } else if ((ev.key === "#" || ev.key === "Delete") && current) {
      ev.preventDefault();
      var row = current, id = Number(row.dataset.id), next = all[i + 1] || all[i - 1] || null;
      call("DELETE", boxApi(row.dataset.mailbox, "/messages/" + id)).then(function (r) {
        if (!r.ok) { say(r.message); return; }
        var open = paneEl && paneEl.querySelector("#message");
        if (open && Number(open.dataset.id) === id) clearPane();
        removeRows([id]); setCurrent(next); say("deleted");
      });
    }
  });

  // ---- the live list of one inbox ----
  function arrived(m, address, showMailbox) {
    if (document.getElementById("m" + m.id)) return;
    var empty = document.getElementById("empty"); if (empty) empty.remove();
    var row = buildRow(m, address, showMailbox); row.classList.add("new");
    list.insertBefore(row, list.firstChild);
    var count = document.getElementById("count"); if (count) count.textContent = String(Number(count.textContent) + 1);
    notifyNew(m);
  }
  function listen(address, showMailbox, live) {
    if (!window.EventSource) return;
    var es = new EventSource(boxApi(address, "/events"));
    es.addEventListener("open", function () { if (live) { live.classList.add("on"); live.title = "live"; } });
    es.addEventListener("error", function () { if (live) { live.classList.remove("on"); live.title = "reconnecting"; } });
    es.addEventListener("message", function (ev) { arrived(JSON.parse(ev.data), address, showMailbox); });
    es.addEventListener("closed", function () {
      es.close();
      if (live) { live.classList.remove("on"); live.title = "closed"; }
      var c = document.getElementById("closed"); if (c) c.hidden = false;
    });
  }
  // live on the first page only: a later page (?before_id=) holds older mail, new mail goes on the first
  if (root && root.dataset.view === "inbox" && list && list.id === "messages" && !root.dataset.paged) {
    listen(root.dataset.address, false, document.getElementById("live"));
  }

  // ---- all the mail of an API key's owner ----
  if (root && root.dataset.view === "all") {
    var more = document.getElementById("more"), oldest = null;
    var load = function () {
      // the search box's query (q) or the tag filter: newest first either way, the next page before the oldest shown
      var q = "?limit=50" + (oldest ? "&before_id=" + oldest : "") + (root.dataset.tag ? "&tag=" + enc(root.dataset.tag) : "")
        + (root.dataset.q ? "&q=" + enc(root.dataset.q) : "");
      call("GET", "/api/v1/messages" + q).then(function (r) {
        var empty = document.getElementById("empty");
        if (!r.ok) {
          if (empty) empty.textContent = r.missing ? "This server does not list all mail yet: open an inbox above." : r.message;
          return;
        }
        if (empty) empty.remove();
        r.body.forEach(function (m) {
          if (!document.getElementById("m" + m.id)) list.appendChild(buildRow(m, m.mailbox, true));
          oldest = oldest == null ? m.id : Math.min(oldest, m.id);
        });
        if (!rows().length) {
          var e = el("li", "empty", root.dataset.q ? "No message matches." : "No mail yet."); e.id = "empty"; list.appendChild(e);
        }
        more.hidden = r.body.length < 50;
      });
    };
    more.addEventListener("click", load);
    load();
    // live: one event stream per open inbox (the first 10); not on search results (new mail may not match)
    if (!root.dataset.q) Array.prototype.slice.call(document.querySelectorAll("#mailboxes a"), 0, 10).forEach(function (a) {
      listen(a.textContent, true, null);
    });
  }
})();
