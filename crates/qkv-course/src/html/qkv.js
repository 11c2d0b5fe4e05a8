/* qkv.js: the lesson page's script. Hand-written, no framework, no build step, no network.
 *
 * The page is complete without it: every quiz shows its answer behind <details>, every widget
 * its numbers in a table. This script only upgrades the elements marked data-qkv-* in place
 * (the DOM contract is documented in content/README.md):
 *   - quizzes: options become buttons, numbers an input; tries, credit and messages;
 *   - progress: per section, kept in localStorage under one key, "qkv-progress";
 *   - drag-query widgets: the plane is shown and every number follows the handle;
 *   - attention-matrix widgets: rows open their query's worked steps;
 *   - the lab: a copy button on code blocks, and the notebook saved from the page's own copy
 *     when the page is read from file:// (where a browser would rather show the file).
 * It is a classic script, not a module: module scripts do not load from file://.
 */
(function () {
  "use strict";

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

  /* A number as a learner may write it: 0.731, .731, 0,731 (decimal comma), 73.1%, 3/4, with
   * spaces anywhere. null when it is not a number. */
  function parseNumber(text) {
    var t = String(text).replace(/\s+/g, "").replace(/\u2212/g, "-");
    var percent = t.slice(-1) === "%";
    if (percent) t = t.slice(0, -1);
    var decimal = function (s) {
      return /^[+-]?(\d+([.,]\d*)?|[.,]\d+)$/.test(s) ? Number(s.replace(",", ".")) : null;
    };
    var parts = t.split("/");
    var value;
    if (parts.length === 1) {
      value = decimal(parts[0]);
    } else if (parts.length === 2) {
      var a = decimal(parts[0]);
      var b = decimal(parts[1]);
      value = a === null || b === null || b === 0 ? null : a / b;
    } else {
      value = null;
    }
    if (value === null || !isFinite(value)) return null;
    return percent ? value / 100 : value;
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

  /* ---------- quizzes ---------- */

  var MESSAGES = {
    rightFirst: function (graded) {
      return graded ? "Right on the first try: full credit." : "Right on the first try.";
    },
    rightLater: function (graded, n, credit) {
      return graded ? "Right on try " + n + ", which earns " + creditWords(credit) + "." : "Right on try " + n + ".";
    },
    wrong: function (graded, left, next) {
      var tries = left === 1 ? "one try left" : left + " tries left";
      return graded
        ? "Try again (" + tries + "): a right answer now earns " + creditWords(next) + "."
        : "Try again (" + tries + ").";
    },
    wrongAfterShown: "Not this one either; the answer is shown below.",
    exhausted: function (graded) {
      return (
        "Three tries are used up, so the answer and the reasoning behind it are below." +
        (graded ? " This check now scores nothing." : "")
      );
    },
    shown: function (graded, kind) {
      if (kind === "short") return "Here is a model answer: compare it with yours.";
      return graded
        ? "The answer is below. Looking first means this check scores nothing, though you can still answer it for yourself."
        : "The answer is below. Cover it and try again whenever you like.";
    },
    rightAfterShown: function (graded) {
      return graded ? "Right. The answer was already on the page, though, so this check adds nothing to your score." : "Right.";
    },
    invalid:
      "That does not read as a number. Write it with digits, such as 0.731, .731, 73.1% or 3/4. No try was used.",
    restored: function (state, credit, left, next) {
      if (state === "right") return "You answered this one earlier, for " + creditWords(credit) + ".";
      if (state === "revealed") return "You saw the answer to this one earlier.";
      return (
        "You tried this one earlier and have " + (left === 1 ? "one try" : left + " tries") +
        " left: a right answer now earns " + creditWords(next) + "."
      );
    },
  };

  function Quiz(root, onChange) {
    this.root = root;
    this.onChange = onChange;
    this.id = root.getAttribute("data-qkv-quiz");
    this.key = json(root, "script[data-qkv-key]") || {};
    this.kind = this.key.kind;
    this.graded = this.key.graded === true;
    this.credit = this.key.credit || [1, 0.5, 0.25];
    this.build();
    this.reset();
  }

  /* Turns the no-script view (options list, hint and answer behind <details>) into controls. */
  Quiz.prototype.build = function () {
    var root = this.root;
    var self = this;
    this.answer = root.querySelector("[data-qkv-answer]");
    var answerBox = root.querySelector("details.quiz-answer");
    if (this.answer && answerBox) {
      answerBox.parentNode.insertBefore(this.answer, answerBox);
      answerBox.parentNode.removeChild(answerBox);
    }
    this.feedbackFor = {};
    root.querySelectorAll("[data-qkv-feedback-for]").forEach(function (li) {
      var text = li.querySelector("[data-qkv-feedback-text]");
      self.feedbackFor[li.getAttribute("data-qkv-feedback-for")] = text ? text.innerHTML : "";
    });

    if (this.key.shuffle === true) shuffleOptions(root, this.id);
    this.options = [];
    root.querySelectorAll("li[data-qkv-choice]").forEach(function (li) {
      var letter = li.getAttribute("data-qkv-choice");
      var b = el("button", { type: "button", "data-qkv-option": letter, "aria-pressed": "false" });
      while (li.firstChild) b.appendChild(li.firstChild);
      li.appendChild(b);
      b.addEventListener("click", function () {
        self.answerWith(letter === self.key.correct, letter);
      });
      self.options.push(b);
    });

    var controls = el("div", { class: "quiz-controls" });
    if (this.kind === "numeric") {
      this.input = el("input", {
        type: "text",
        "data-qkv-input": "",
        inputmode: "decimal",
        autocomplete: "off",
        spellcheck: "false",
        "aria-label": "Your answer",
      });
      this.submit = button("Check", "data-qkv-submit");
      this.input.addEventListener("keydown", function (e) {
        if (e.key === "Enter") {
          e.preventDefault();
          self.answerNumber();
        }
      });
      this.submit.addEventListener("click", function () {
        self.answerNumber();
      });
      controls.appendChild(this.input);
      controls.appendChild(this.submit);
    } else if (this.kind === "short") {
      this.input = el("textarea", { "data-qkv-input": "", rows: "3", "aria-label": "Your answer" });
      root.insertBefore(this.input, this.answer);
    }

    var hintBox = root.querySelector("details.quiz-hint");
    this.hintText = root.querySelector("[data-qkv-hint-text]");
    if (hintBox && this.hintText) {
      hintBox.parentNode.insertBefore(this.hintText, hintBox);
      hintBox.parentNode.removeChild(hintBox);
      this.hint = button("Hint", "data-qkv-hint");
      this.hint.addEventListener("click", function () {
        self.hintText.hidden = false;
        self.hint.disabled = true;
      });
      controls.appendChild(this.hint);
    }
    this.show = button(this.kind === "short" ? "Show a model answer" : "Show answer", "data-qkv-show");
    this.show.addEventListener("click", function () {
      self.revealByChoice();
    });
    controls.appendChild(this.show);
    root.insertBefore(controls, this.hintText || this.answer);

    this.feedback = el("p", { "data-qkv-feedback": "", role: "status", "aria-live": "polite", tabindex: "-1" });
    root.insertBefore(this.feedback, this.answer);
  };

  /* Back to a fresh quiz: no tries, nothing shown. */
  Quiz.prototype.reset = function () {
    this.state = "unanswered";
    this.tries = 0;
    this.earned = 0;
    this.wrong = []; // the wrong options chosen so far, kept so a reload disables them again
    this.options.forEach(function (b) {
      b.disabled = false;
      b.setAttribute("aria-pressed", "false");
      b.classList.remove("chosen-wrong", "chosen-right");
    });
    if (this.input) {
      this.input.value = "";
      this.input.disabled = false;
    }
    if (this.submit) this.submit.disabled = false;
    if (this.hintText) this.hintText.hidden = true;
    if (this.hint) this.hint.disabled = false;
    if (this.answer) this.answer.hidden = true;
    this.show.hidden = false;
    this.say(null, "");
    this.sync();
  };

  /* A saved state after a reload: right or revealed (and its answer shown), or wrong tries, with
   * the wrong options chosen so far pressed again. */
  Quiz.prototype.restore = function (saved) {
    if (!saved || ["wrong", "right", "revealed"].indexOf(saved.state) < 0) return;
    var self = this;
    this.state = saved.state;
    this.tries = Math.max(0, Math.min(TRIES, Number(saved.tries) || 0));
    this.earned = saved.state === "right" ? Number(saved.credit) || 0 : 0;
    (Array.isArray(saved.wrong) ? saved.wrong : []).forEach(function (letter) {
      if (letter !== self.key.correct) self.pressWrong(letter);
    });
    if (saved.state === "right") {
      this.markRight(this.key.correct);
    } else if (saved.state === "revealed") {
      this.showAnswer();
    }
    this.say(null, MESSAGES.restored(this.state, this.earned, TRIES - this.tries, this.credit[this.tries]));
    this.sync();
  };

  /* Keeps the root's attributes current: the DOM is the state outside tools read. */
  Quiz.prototype.sync = function () {
    this.root.setAttribute("data-qkv-state", this.state);
    this.root.setAttribute("data-qkv-credit", decimalString(this.earned));
    this.root.setAttribute("data-qkv-tries", String(this.tries));
  };

  Quiz.prototype.say = function (outcome, html) {
    if (outcome) this.feedback.setAttribute("data-qkv-outcome", outcome);
    else this.feedback.removeAttribute("data-qkv-outcome");
    this.feedback.innerHTML = html;
    // An outcome follows the learner's answer. The control just used may now be disabled (a
    // chosen option, a right number) or hidden ("Show answer"), which drops the focus to <body>:
    // it goes to the message instead, so the learner stays in the quiz.
    var active = document.activeElement;
    var lost = !active || active === document.body;
    if (outcome && (lost || (this.root.contains(active) && (active.disabled || active.closest("[hidden]"))))) {
      this.feedback.focus({ preventScroll: true });
    }
  };

  Quiz.prototype.showAnswer = function () {
    if (this.answer) this.answer.hidden = false;
    this.show.hidden = true;
  };

  /* The answer is right: lock the controls and show the answer with its explanation. */
  Quiz.prototype.markRight = function (letter) {
    this.options.forEach(function (b) {
      var right = b.getAttribute("data-qkv-option") === letter;
      b.disabled = true;
      b.setAttribute("aria-pressed", right ? "true" : "false");
      if (right) b.classList.add("chosen-right");
    });
    if (this.input) this.input.disabled = true;
    if (this.submit) this.submit.disabled = true;
    this.showAnswer();
  };

  /* One answer: `right` says whether it is; `letter` is the option chosen (choice quizzes);
   * `help` is extra HTML for a wrong answer (an option's feedback, "too high"). */
  Quiz.prototype.answerWith = function (right, letter, help) {
    if (this.state === "right") return;
    help = help || (letter ? this.feedbackFor[letter] || "" : "");
    var lead = help ? help + " " : "";
    if (this.state === "revealed") {
      if (right) {
        this.markRight(letter);
        this.say("right-after-shown", MESSAGES.rightAfterShown(this.graded));
      } else {
        this.pressWrong(letter);
        this.say("wrong", lead + MESSAGES.wrongAfterShown);
      }
      this.changed();
      return;
    }
    if (right) {
      var n = this.tries + 1;
      this.state = "right";
      this.earned = this.graded ? this.credit[this.tries] : 0;
      this.markRight(letter);
      if (n === 1) this.say("right-first", MESSAGES.rightFirst(this.graded));
      else this.say("right-later", MESSAGES.rightLater(this.graded, n, this.earned));
    } else {
      this.tries += 1;
      this.pressWrong(letter);
      if (this.tries >= TRIES) {
        this.state = "revealed";
        this.earned = 0;
        this.showAnswer();
        this.say("exhausted", lead + MESSAGES.exhausted(this.graded));
      } else {
        this.state = "wrong";
        this.say("wrong", lead + MESSAGES.wrong(this.graded, TRIES - this.tries, this.credit[this.tries]));
      }
    }
    this.changed();
  };

  Quiz.prototype.pressWrong = function (letter) {
    if (letter && this.wrong.indexOf(letter) < 0) this.wrong.push(letter);
    this.options.forEach(function (b) {
      if (b.getAttribute("data-qkv-option") === letter) {
        b.disabled = true;
        b.setAttribute("aria-pressed", "true");
        b.classList.add("chosen-wrong");
      }
    });
  };

  Quiz.prototype.answerNumber = function () {
    var x = parseNumber(this.input.value);
    if (x === null) {
      this.say("invalid", MESSAGES.invalid);
      return;
    }
    var key = this.key.value;
    // A key shown as a percentage reads a bare number as one too (73.1 for 73.1%), unless the
    // number is the fraction itself (0.731).
    if (this.key.percent === true && !/%\s*$/.test(this.input.value) && Math.abs(x - key) > this.key.tolerance) {
      x = x / 100;
    }
    // A little slack for the rounding of decimal input itself (0.1 is not exact in binary).
    var slack = 1e-9 * Math.max(1, Math.abs(key));
    var right = Math.abs(x - key) <= this.key.tolerance + slack;
    this.answerWith(right, null, right ? "" : x > key ? "Too high." : "Too low.");
  };

  Quiz.prototype.revealByChoice = function () {
    if (this.state === "right" || this.state === "revealed") return;
    this.state = "revealed";
    this.earned = 0;
    this.showAnswer();
    this.say("shown", MESSAGES.shown(this.graded, this.kind));
    this.changed();
  };

  Quiz.prototype.changed = function () {
    this.sync();
    this.onChange(this);
  };

  /* ---------- progress, per section ---------- */

  function setupQuizzes() {
    var roots = document.querySelectorAll("[data-qkv-quiz]");
    if (!roots.length) return;
    var all = loadAll();
    var quizzes = [];
    var indicators = document.querySelectorAll("[data-qkv-progress]");

    function update() {
      indicators.forEach(function (p) {
        var section = p.getAttribute("data-qkv-section");
        var answered = 0;
        var score = 0;
        var total = 0;
        quizzes.forEach(function (q) {
          if (!q.graded || q.root.getAttribute("data-qkv-section") !== section) return;
          total += 1;
          if (q.state === "right" || q.state === "revealed") {
            answered += 1;
            score += q.earned;
          }
        });
        p.setAttribute("data-qkv-answered", String(answered));
        p.setAttribute("data-qkv-total", String(total));
        p.setAttribute("data-qkv-score", decimalString(score));
        var text = p.querySelector("[data-qkv-progress-text]");
        if (text) {
          text.textContent =
            answered + " of " + total + (total === 1 ? " check" : " checks") + " answered, score " +
            decimalString(score) + " of " + total;
        }
        var bar = p.querySelector("progress");
        if (bar) {
          bar.max = total;
          bar.value = answered;
        }
      });
    }

    function store(q) {
      if (!q.graded) return; // practice never counts, and is never kept
      var section = q.root.getAttribute("data-qkv-section");
      all = loadAll();
      all[section] = all[section] || {};
      all[section][q.id] = { state: q.state, credit: q.earned, tries: q.tries, wrong: q.wrong };
      saveAll(all);
    }

    roots.forEach(function (root) {
      var q = new Quiz(root, function (changed) {
        store(changed);
        update();
      });
      var section = root.getAttribute("data-qkv-section");
      if (q.graded && all[section]) q.restore(all[section][q.id]);
      quizzes.push(q);
    });

    indicators.forEach(function (p) {
      var section = p.getAttribute("data-qkv-section");
      var reset = p.querySelector("[data-qkv-reset]");
      if (reset) {
        reset.addEventListener("click", function () {
          all = loadAll();
          delete all[section];
          saveAll(all);
          quizzes.forEach(function (q) {
            if (q.root.getAttribute("data-qkv-section") === section) q.reset();
          });
          update();
        });
      }
      p.hidden = false;
    });
    update();
  }

  /* ---------- drag-query widgets ---------- */

  function setupDrag(root) {
    var data = json(root, "script[data-qkv-data]");
    var svg = root.querySelector("svg[data-qkv-plane]");
    var handle = root.querySelector("[data-qkv-handle]");
    if (!data || !svg || !handle) return;
    var plane = data.plane;
    var unit = (plane.size - 2 * plane.pad) / (2 * plane.extent);
    var digits = data.digits;
    var byAttr = function (attr, label) {
      return root.querySelector("[" + attr + '="' + CSS.escape(label) + '"]');
    };
    var parts = data.labels.map(function (label) {
      return {
        line: byAttr("data-qkv-line", label),
        bar: byAttr("data-qkv-bar", label),
        dot: byAttr("data-qkv-readout", "dot:" + label),
        score: byAttr("data-qkv-readout", "score:" + label),
        weight: byAttr("data-qkv-readout", "weight:" + label),
      };
    });
    var outputs = root.querySelectorAll('[data-qkv-readout^="output"]');
    var arrow = root.querySelector("[data-qkv-query-arrow]");
    var start = root.querySelector("[data-qkv-start]");
    var goal = root.querySelector("[data-qkv-goal]");
    var goalText = root.querySelector("[data-qkv-goal-text]");
    var reset = root.querySelector("[data-qkv-reset]");
    // What the build wrote at the declared query: shown again, byte for byte, after a reset.
    var written = Array.prototype.map.call(root.querySelectorAll("[data-qkv-readout], [data-qkv-start]"), function (n) {
      return [n, n.innerHTML];
    });
    var goalWritten = goalText ? goalText.textContent : "";
    var q = data.query.slice();
    var queryLabel = root.querySelector("[data-qkv-query-label]");
    var keyBoxes = null;

    function toScreen(x, y) {
      return [plane.pad + (x + plane.extent) * unit, plane.size - plane.pad - (y + plane.extent) * unit];
    }

    /* The engine's reference for one query, in the same order of operations
     * (qkv::reference::trace_query): dot products, times the scale, masked keys at -inf, subtract
     * the max, exponentiate, divide by the sum, weight the values. */
    function attend(query) {
      var dots = data.keys.map(function (k) {
        var s = 0;
        for (var i = 0; i < k.length; i++) s += query[i] * k[i];
        return s;
      });
      var scores = dots.map(function (d, j) {
        return data.kept[j] ? d * data.scale : -Infinity;
      });
      var max = -Infinity;
      scores.forEach(function (s) {
        if (isFinite(s) && s > max) max = s;
      });
      var exps = scores.map(function (s, j) {
        return data.kept[j] ? Math.exp(s - max) : 0;
      });
      var sum = 0;
      exps.forEach(function (e) {
        sum += e;
      });
      var weights = exps.map(function (e) {
        return sum > 0 ? e / sum : 0;
      });
      var output = data.values[0].map(function (_, c) {
        var o = 0;
        weights.forEach(function (a, j) {
          o += a * data.values[j][c];
        });
        return o;
      });
      return { dots: dots, scores: scores, weights: weights, output: output };
    }

    /* Spots for the "q" beside the handle (its baseline, in the handle's units), in order of
     * preference: the first that keeps clear of every key's label, else the clearest. */
    var SPOTS = [[13, 20], [-21, 20], [13, -9], [-21, -9]];
    function placeQueryLabel(p) {
      if (!queryLabel) return;
      if (!keyBoxes) {
        // Measured once the plane is shown; the labels never move.
        keyBoxes = Array.prototype.map.call(svg.querySelectorAll(".key-label"), function (t) {
          return t.getBBox();
        });
      }
      var best = SPOTS[0];
      var clearest = -1;
      SPOTS.some(function (s) {
        var x = p[0] + s[0] + 4; // the middle of the glyph, about 8 by 12 units
        var y = p[1] + s[1] - 6;
        var gap = Infinity;
        keyBoxes.forEach(function (b) {
          var dx = Math.max(b.x - x, 0, x - b.x - b.width);
          var dy = Math.max(b.y - y, 0, y - b.y - b.height);
          gap = Math.min(gap, Math.sqrt(dx * dx + dy * dy));
        });
        if (gap > clearest) {
          clearest = gap;
          best = s;
        }
        return gap >= 10;
      });
      queryLabel.setAttribute("x", String(best[0]));
      queryLabel.setAttribute("y", String(best[1]));
    }

    function largest(weights, g) {
      return weights.every(function (w, j) {
        return j === g || w < weights[g];
      });
    }

    function render() {
      var r = attend(q);
      var p = toScreen(q[0], q[1]);
      var atStart = q[0] === data.query[0] && q[1] === data.query[1];
      root.setAttribute("data-qkv-query", q[0] + "," + q[1]);
      handle.setAttribute("transform", "translate(" + p[0].toFixed(1) + " " + p[1].toFixed(1) + ")");
      placeQueryLabel(p);
      // One slider for the plane: its value is q's x (Left and Right), its text both coordinates.
      handle.setAttribute("aria-valuenow", String(q[0]));
      handle.setAttribute("aria-valuetext", "q = (" + fixed(q[0], 2) + ", " + fixed(q[1], 2) + ")");
      if (arrow) {
        arrow.setAttribute("x2", p[0].toFixed(1));
        arrow.setAttribute("y2", p[1].toFixed(1));
      }
      parts.forEach(function (part, j) {
        var w = r.weights[j];
        if (part.line) {
          part.line.setAttribute("x1", p[0].toFixed(1));
          part.line.setAttribute("y1", p[1].toFixed(1));
          part.line.setAttribute("stroke-width", data.kept[j] ? (1 + 9 * w).toFixed(2) : "0");
        }
        if (part.bar) part.bar.style.width = (100 * w).toFixed(2) + "%";
        if (part.dot) part.dot.textContent = fixed(r.dots[j], digits);
        if (part.score) part.score.textContent = data.kept[j] ? fixed(r.scores[j], digits) : "masked";
        if (part.weight) part.weight.textContent = fixed(w, digits);
      });
      outputs.forEach(function (node) {
        var name = node.getAttribute("data-qkv-readout");
        var c = name === "output" ? 0 : Number(name.split(":")[1]) - 1;
        node.textContent = fixed(r.output[c], digits);
      });
      if (start) {
        start.innerHTML = "Now <i>q</i> = (" + fixed(q[0], 2) + ", " + fixed(q[1], 2) + "):";
      }
      if (atStart) {
        written.forEach(function (w) {
          w[0].innerHTML = w[1];
        });
      }
      if (goal && data.goal) {
        var g = data.labels.indexOf(data.goal.largest);
        // The check follows the query: it shows while the goal holds, so it never claims a
        // state the plane no longer shows.
        var met = largest(r.weights, g);
        goal.setAttribute("data-qkv-met", met ? "true" : "false");
        if (goalText) {
          goalText.textContent = met ? "Done: “" + data.goal.largest + "” now has the largest weight." : goalWritten;
        }
      }
      announceSoon();
    }

    /* What the readouts and the goal show, said through the polite live region once the query
     * has rested for a moment: a drag or a held arrow key would otherwise queue a sentence per
     * step. The text is read back from the readouts, so it says exactly what the page shows. */
    var announce = root.querySelector("[data-qkv-announce]");
    var announceTimer = null;
    function announceSoon() {
      if (!announce) return;
      clearTimeout(announceTimer);
      announceTimer = setTimeout(function () {
        var said = [handle.getAttribute("aria-valuetext") + "."];
        said.push("Weights: " + parts.map(function (part, j) {
          return data.labels[j] + " " + (part.weight ? part.weight.textContent : "");
        }).join(", ") + ".");
        said.push("Output: " + Array.prototype.map.call(outputs, function (n) {
          return n.textContent;
        }).join(", ") + ".");
        if (goalText) said.push(goalText.textContent);
        announce.textContent = said.join(" ");
      }, 600);
    }

    function clamp(x) {
      return Math.max(-plane.extent, Math.min(plane.extent, x));
    }

    function moveTo(x, y) {
      q = [clamp(x), clamp(y)];
      render();
    }

    function fromPointer(e) {
      var m = svg.getScreenCTM();
      if (!m) return;
      var pt = svg.createSVGPoint();
      pt.x = e.clientX;
      pt.y = e.clientY;
      var u = pt.matrixTransform(m.inverse());
      moveTo((u.x - plane.pad) / unit - plane.extent, (plane.size - plane.pad - u.y) / unit - plane.extent);
    }

    var dragging = null;
    svg.addEventListener("pointerdown", function (e) {
      // Any pointer, touch included, grabs the query wherever it lands on the plane (the plane
      // does not scroll the page: Chrome ignores touch-action on the SVG handle itself).
      dragging = e.pointerId;
      svg.setPointerCapture(e.pointerId);
      handle.focus({ preventScroll: true });
      fromPointer(e);
      e.preventDefault();
    });
    svg.addEventListener("pointermove", function (e) {
      if (dragging === e.pointerId) fromPointer(e);
    });
    var stop = function (e) {
      if (dragging === e.pointerId) dragging = null;
    };
    svg.addEventListener("pointerup", stop);
    svg.addEventListener("pointercancel", stop);

    handle.addEventListener("keydown", function (e) {
      var step = e.shiftKey ? 0.25 : 0.05;
      var d = { ArrowLeft: [-step, 0], ArrowRight: [step, 0], ArrowUp: [0, step], ArrowDown: [0, -step] }[e.key];
      if (!d) return;
      e.preventDefault();
      moveTo(q[0] + d[0], q[1] + d[1]);
    });

    if (reset) {
      reset.addEventListener("click", function () {
        q = data.query.slice();
        render();
      });
    }
    var box = root.querySelector(".plane");
    if (box) box.hidden = false;
    if (reset) reset.hidden = false;
    placeQueryLabel(toScreen(q[0], q[1]));
  }

  /* ---------- attention-matrix widgets ---------- */

  function setupMatrix(root) {
    var rows = root.querySelectorAll("tr[data-qkv-row]");
    var panels = {};
    root.querySelectorAll("[data-qkv-steps]").forEach(function (panel, i) {
      panels[panel.getAttribute("data-qkv-steps")] = panel;
      panel.id = panel.id || root.id + "-steps-" + i;
      panel.hidden = true;
    });
    function pick(row) {
      var label = row.getAttribute("data-qkv-row");
      var open = row.getAttribute("aria-expanded") !== "true";
      rows.forEach(function (r) {
        var mine = r === row && open;
        r.setAttribute("aria-expanded", mine ? "true" : "false");
        r.classList.toggle("picked", mine);
        var panel = panels[r.getAttribute("data-qkv-row")];
        if (panel) {
          panel.hidden = !mine;
          panel.open = mine;
        }
      });
      if (open && panels[label]) panels[label].scrollIntoView({ block: "nearest" });
    }
    rows.forEach(function (row) {
      var panel = panels[row.getAttribute("data-qkv-row")];
      row.tabIndex = 0;
      row.setAttribute("role", "button");
      row.setAttribute("aria-expanded", "false");
      if (panel) row.setAttribute("aria-controls", panel.id);
      row.addEventListener("click", function () {
        pick(row);
      });
      row.addEventListener("keydown", function (e) {
        if (e.key === "Enter" || e.key === " ") {
          e.preventDefault();
          pick(row);
        }
      });
    });
  }

  /* ---------- the lab ---------- */

  function copyText(text) {
    if (navigator.clipboard && window.isSecureContext) {
      return navigator.clipboard.writeText(text);
    }
    return new Promise(function (resolve, reject) {
      var area = el("textarea", { readonly: "", class: "offscreen" });
      area.value = text;
      document.body.appendChild(area);
      area.select();
      var ok = false;
      try {
        ok = document.execCommand("copy");
      } catch (e) {
        ok = false;
      }
      document.body.removeChild(area);
      if (ok) resolve();
      else reject(new Error("copy refused"));
    });
  }

  function setupCopyButtons() {
    document.querySelectorAll("pre > code").forEach(function (code) {
      var pre = code.parentNode;
      var b = el("button", { type: "button", class: "copy", "data-qkv-copy": "" }, "Copy");
      b.addEventListener("click", function () {
        copyText(code.textContent).then(
          function () {
            b.textContent = "Copied";
          },
          function () {
            b.textContent = "Select and copy";
          }
        );
        setTimeout(function () {
          b.textContent = "Copy";
        }, 1600);
      });
      pre.classList.add("has-copy");
      pre.insertBefore(b, code);
    });
  }

  /* From file:// a browser shows a linked local file instead of saving it, download attribute
   * or not; the page carries the notebook's text, so hand that over as a file. */
  function setupNotebookLinks() {
    if (window.location.protocol !== "file:") return;
    document.querySelectorAll("a[data-qkv-notebook]").forEach(function (link) {
      var holder = link.closest("p");
      var next = holder && holder.nextElementSibling;
      if (!next || !next.hasAttribute("data-qkv-notebook-text")) return;
      link.addEventListener("click", function (e) {
        var nb;
        try {
          nb = JSON.parse(next.textContent);
        } catch (err) {
          return;
        }
        e.preventDefault();
        var url = URL.createObjectURL(new Blob([nb.text], { type: "application/x-ipynb+json" }));
        var a = el("a", { href: url, download: nb.name });
        document.body.appendChild(a);
        a.click();
        document.body.removeChild(a);
        setTimeout(function () {
          URL.revokeObjectURL(url);
        }, 5000);
      });
    });
  }

  function init() {
    setupQuizzes();
    document.querySelectorAll('[data-qkv-widget="drag-query"]').forEach(setupDrag);
    document.querySelectorAll('[data-qkv-widget="attention-matrix"]').forEach(setupMatrix);
    setupCopyButtons();
    setupNotebookLinks();
    document.documentElement.classList.add("qkv-js");
    // Outside tools wait on this rather than guess when the page is live.
    document.documentElement.setAttribute("data-qkv-ready", "true");
  }

  if (document.readyState === "loading") document.addEventListener("DOMContentLoaded", init);
  else init();
})();
