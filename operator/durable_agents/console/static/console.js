// The console's only script (served from the package; the Content-Security-Policy allows no other).
// One server-sent-event stream per page, relaying one watch the console makes as you: on a change
// the page fetches itself again and swaps its <main>; a page showing revealed values is never
// replaced (they exist in that response only): it says that the run changed.
"use strict";
// Expiry countdowns: each <span data-expires="ISO time"> says how long is left.
function countdown() {
  for (const span of document.querySelectorAll("[data-expires]")) {
    const left = Math.floor((Date.parse(span.dataset.expires) - Date.now()) / 1000);
    if (Number.isNaN(left)) { continue; }
    if (left <= 0) { span.textContent = "expired"; continue; }
    const h = Math.floor(left / 3600), m = Math.floor(left % 3600 / 60), s = left % 60;
    span.textContent = "in " + (h ? h + "h" + String(m).padStart(2, "0") + "m" : m ? m + "m" + String(s).padStart(2, "0") + "s" : s + "s");
  }
}
(function () {
  const main = document.getElementById("main");
  const banner = document.getElementById("connection");
  countdown();
  setInterval(countdown, 1000);
  if (!main || !main.dataset.live) { return; }
  const pageUrl = main.dataset.pageUrl || (location.pathname + location.search);
  if (main.dataset.pageUrl && location.pathname !== main.dataset.pageUrl && !main.dataset.revealed) {
    history.replaceState(null, "", main.dataset.pageUrl);  // after an action's POST: the run's own URL
  }
  function say(text) {
    banner.textContent = text;
    banner.classList.toggle("hidden", !text);
  }
  // One fetch at a time; a change that arrives meanwhile fetches once more after it (never lost),
  // and a burst of changes within 250 ms is one fetch.
  let busy = false, again = false, timer = null;
  function refresh() {
    if (timer === null) { timer = setTimeout(function () { timer = null; fetchPage(); }, 250); }
  }
  async function fetchPage() {
    if (busy) { again = true; return; }
    if (document.getElementById("main").dataset.revealed) {
      say("The run changed. Reload the page to see it (the revealed values will be hidden again).");
      return;
    }
    busy = true;
    try {
      const answer = await fetch(pageUrl, { credentials: "same-origin", headers: { "Accept": "text/html" } });
      const page = new DOMParser().parseFromString(await answer.text(), "text/html");
      const fresh = page.getElementById("main");
      if (fresh) {
        fresh.dataset.live = document.getElementById("main").dataset.live;
        document.getElementById("main").replaceWith(fresh);
        countdown();
      }
    } catch (err) {
      say("The console cannot be reached; trying again.");
    } finally {
      busy = false;
      if (again) { again = false; refresh(); }
    }
  }
  const events = new EventSource(main.dataset.live);
  events.addEventListener("change", refresh);
  events.addEventListener("deleted", function () { say("This run was deleted."); });
  events.addEventListener("down", function (e) {
    let message = "The API server cannot be reached; trying again.";
    try { message = JSON.parse(e.data).message || message; } catch (err) { /* keep the default */ }
    say(message);
  });
  events.addEventListener("refused", function (e) {
    events.close();
    try { say(JSON.parse(e.data).message); } catch (err) { say("This page does not follow changes."); }
  });
  events.addEventListener("up", function () { say(""); refresh(); });
  events.addEventListener("open", function () { if (banner.dataset.lost) { delete banner.dataset.lost; say(""); } });
  events.addEventListener("error", function () { banner.dataset.lost = "1"; say("The console cannot be reached; trying again."); });
  document.body.dataset.live = "connected";
})();
