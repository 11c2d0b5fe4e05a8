/* qkv.js: the course's page script. Hand-written, no framework, no network. The build joins
 * the files of crates/qkv-course/src/html/js/ in the order html.rs lists them (this one first,
 * init.js last) inside one function scope, so each feature or widget is one file: a feature
 * pushes its setup onto FEATURES, a widget registers WIDGETS[kind] for its data-qkv-widget kind.
 *
 * The page is complete without it: every quiz shows its answer behind <details>, every widget
 * its numbers in a table. This script only upgrades the elements marked data-qkv-* in place
 * (the DOM contract is documented in content/README.md):
 *   - quizzes: options become buttons, numbers an input; tries, credit and messages;
 *   - progress: per section and across the course (kept in localStorage under one key,
 *     "qkv-progress"), the section's summary, and resets that ask first;
 *   - search: across every section, from the index search-index.js;
 *   - drag-query widgets: the plane is shown and every number follows the handle;
 *   - attention-matrix widgets: rows open their query's worked steps;
 *   - decode-stepper widgets: "Previous" and "Next token" walk the decoding steps;
 *   - the lab: a copy button on code blocks, and the notebook saved from the page's own copy
 *     when the page is read from file:// (where a browser would rather show the file).
 * It is a classic script, not a module: module scripts do not load from file://.
 */
(function () {
  "use strict";

  /* Page-wide setups, run in file order, and widget setups by data-qkv-widget kind. */
  var FEATURES = [];
  var WIDGETS = {};

  var STORE = "qkv-progress";
  var TRIES = 3;

  /* ---------- small helpers ---------- */

  function el(tag, attrs, text) {
    var e = document.createElement(tag);
    Object.keys(attrs || {}).forEach(function (name) {
      e.setAttribute(name, attrs[name]);
    });
    if (text) e.textContent = text;
    return e;
  }

  function button(label, attr) {
    var attrs = { type: "button" };
    attrs[attr] = "";
    return el("button", attrs, label);
  }

  function json(root, selector) {
    var node = root.querySelector(selector);
    try {
      return node ? JSON.parse(node.textContent) : null;
    } catch (e) {
      return null;
    }
  }

  /* ---------- numbers ---------- */

  /* x with d decimals, exactly as the build prints it (qkv-course format::fixed): exact ties
   * round to even, as Rust does (toFixed rounds them away from zero), and no "-0.00". A tie at d
   * decimals has at most d + 1 binary fractional digits, so x * 2^(d+1) is a whole number and
   * toFixed(d + 1) writes it exactly. */
  function fixed(x, d) {
    if (x === Infinity) return "∞";
    if (x === -Infinity) return "-∞";
    var a = Math.abs(x);
    var s = a.toFixed(d);
    if (Number.isInteger(a * Math.pow(2, d + 1))) {
      var exact = a.toFixed(d + 1);
      if (exact.charAt(exact.length - 1) === "5") {
        var lower = exact.slice(0, d === 0 ? -2 : -1);
        if (Number(lower.charAt(lower.length - 1)) % 2 === 0) s = lower;
      }
    }
    return x < 0 && /[1-9]/.test(s) ? "-" + s : s;
  }

  /* A number as a learner may write it: 0.731, .731, 0,731 (decimal comma), 1,560 or 12,345.6
   * (thousands grouped), 73.1%, 3/4, with spaces anywhere. null when it is not a number;
   * otherwise { readings, texts, percent }: the values it may mean, most likely first, and each
   * as the learner would write it without the comma. A single comma before three digits is both
   * (1,560 is 1.56 to some readers and 1560 to others); every other form has one reading. */
  function parseNumber(text) {
    var t = String(text).replace(/\s+/g, "").replace(/\u2212/g, "-");
    var percent = t.slice(-1) === "%";
    if (percent) t = t.slice(0, -1);
    // Each reading as text, without the comma, and its value.
    var readings = function (s) {
      var grouped = s.replace(/,/g, "");
      if (/^[+-]?[1-9]\d{0,2}(,\d{3})+(\.\d*)?$/.test(s)) {
        // One comma and no point: a decimal comma too.
        return /^[^,]*,[^,.]*$/.test(s) ? [s.replace(",", "."), grouped] : [grouped];
      }
      return /^[+-]?(\d+([.,]\d*)?|[.,]\d+)$/.test(s) ? [s.replace(",", ".")] : null;
    };
    var parts = t.split("/");
    var texts = parts.length === 1 ? readings(parts[0]) : null;
    var values = texts && texts.map(Number);
    if (parts.length === 2) {
      var a = readings(parts[0]);
      var b = readings(parts[1]);
      texts = [t];
      values = a === null || b === null || Number(b[0]) === 0 ? null : [Number(a[0]) / Number(b[0])];
    }
    if (values === null || !values.every(isFinite)) return null;
    return {
      readings: values.map(function (x) {
        return percent ? x / 100 : x;
      }),
      texts: texts.map(function (x) {
        return percent ? x + "%" : x;
      }),
      percent: percent,
    };
  }

  /* "full credit", "half the credit", … for a credit between 0 and 1. */
  function creditWords(c) {
    if (c >= 1) return "full credit";
    if (c === 0.5) return "half the credit";
    if (c === 0.25) return "a quarter of the credit";
    if (c <= 0) return "no credit";
    return Math.round(c * 100) + "% of the credit";
  }

  /* A decimal string for an attribute: 1, 0.5, 0.25, 0. */
  function decimalString(x) {
    return String(Math.round(x * 10000) / 10000);
  }

  /* ---------- storage: { SECTION: { QUIZ_ID: { state, credit, tries, wrong } } } ---------- */

  function loadAll() {
    try {
      var all = JSON.parse(window.localStorage.getItem(STORE) || "{}");
      return all && typeof all === "object" ? all : {};
    } catch (e) {
      return {};
    }
  }

  function saveAll(all) {
    try {
      window.localStorage.setItem(STORE, JSON.stringify(all));
    } catch (e) {
      /* Storage can be off (private windows, some file:// settings): progress then lasts the visit. */
    }
  }

  /* ---------- shuffled options: the learner's own order, the same on every visit ---------- */

  /* One random number per learner, kept beside the progress ("~" starts no section id). */
  function learnerSeed() {
    var all = loadAll();
    if (typeof all["~seed"] !== "number") {
      all["~seed"] = Math.floor(Math.random() * 4294967296);
      saveAll(all);
    }
    return all["~seed"];
  }

  /* A permutation of 0..n-1 from the learner's seed and the quiz id (mulberry32, Fisher-Yates). */
  function permutation(n, seed, id) {
    var h = seed >>> 0;
    for (var i = 0; i < id.length; i++) h = Math.imul(h ^ id.charCodeAt(i), 2654435761) >>> 0;
    function next() {
      h = (h + 0x6d2b79f5) >>> 0;
      var t = Math.imul(h ^ (h >>> 15), h | 1);
      t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
      return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
    }
    var order = [];
    for (var k = 0; k < n; k++) order.push(k);
    for (var j = n - 1; j > 0; j--) {
      var r = Math.floor(next() * (j + 1));
      var swap = order[j];
      order[j] = order[r];
      order[r] = swap;
    }
    return order;
  }

  /* Puts the options in the learner's order and letters them by place; the key, the answer and
   * the feedback keep naming options by their declared letters (data-qkv-choice). */
  function shuffleOptions(root, id) {
    var list = root.querySelector("ol.quiz-options");
    if (!list) return;
    var items = Array.prototype.slice.call(list.querySelectorAll("li[data-qkv-choice]"));
    var order = permutation(items.length, learnerSeed(), id);
    var shown = {};
    order.forEach(function (from, place) {
      var li = items[from];
      var letter = String.fromCharCode(97 + place);
      shown[li.getAttribute("data-qkv-choice")] = letter;
      var label = li.querySelector(".quiz-letter");
      if (label) label.textContent = "(" + letter + ")";
      list.appendChild(li);
    });
    root.querySelectorAll(".quiz-key .quiz-letter").forEach(function (label) {
      var declared = label.textContent.replace(/[()]/g, "");
      if (shown[declared]) label.textContent = "(" + shown[declared] + ")";
    });
    root.querySelectorAll("[data-qkv-feedback-for]").forEach(function (li) {
      var strong = li.querySelector("strong");
      var declared = li.getAttribute("data-qkv-feedback-for");
      if (strong && shown[declared]) strong.textContent = "Not (" + shown[declared] + "):";
    });
  }

