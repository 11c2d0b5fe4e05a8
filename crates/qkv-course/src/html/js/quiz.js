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
    nearMiss:
      "Close: keep more decimals until the last step (rounding along the way moves the answer this much). No try was used.",
    invalid:
      "That does not read as a number. Write it with digits, such as 0.731, .731, 73.1% or 3/4. No try was used.",
    notPercentage: "The answer is not a share of a whole, so not a percentage: write it without the % sign. No try was used.",
    eitherWay: function (low, high) {
      return "Not right either way: " + low + " is too low and " + high + " too high.";
    },
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
      // The button is disabled once used, which would drop the focus to <body>: it goes to the
      // hint instead, which a screen reader then reads.
      this.hintText.setAttribute("tabindex", "-1");
      this.hint.addEventListener("click", function () {
        self.hintText.hidden = false;
        self.hint.disabled = true;
        self.hintText.focus({ preventScroll: true });
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
    // A choice quiz says what happened right under its options. A wrong option is disabled once
    // chosen, so the focus moves to this message: from here the next Tab reaches the quiz's own
    // buttons ("Hint", "Show answer") and Shift+Tab the options left, instead of leaving the quiz.
    var list = root.querySelector("ol.quiz-options");
    if (list) list.parentNode.insertBefore(this.feedback, list.nextSibling);
    else root.insertBefore(this.feedback, this.answer);
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
    var parsed = parseNumber(this.input.value);
    if (parsed === null) {
      this.say("invalid", MESSAGES.invalid);
      return;
    }
    // A percentage where the key is no share of a whole (a count, a score, a variance) is a slip
    // in how the number is written, right or wrong: no try.
    if (parsed.percent && this.key.share !== true) {
      this.say("not-a-percentage", MESSAGES.notPercentage);
      return;
    }
    var key = this.key.value;
    var near = this.key.near || 0;
    var band = Math.max(near, this.key.tolerance);
    var percentKey = this.key.percent === true;
    var readings = parsed.readings.map(function (x) {
      // A key shown as a percentage reads a bare number as one too (73.1 for 73.1%), unless the
      // number is the fraction itself (0.731).
      return percentKey && !parsed.percent && Math.abs(x - key) > band ? x / 100 : x;
    });
    // A little slack for the rounding of decimal input itself (0.1 is not exact in binary).
    var slack = 1e-9 * Math.max(1, Math.abs(key));
    var off = readings.map(function (x) {
      return Math.abs(x - key);
    });
    var closest = Math.min.apply(null, off);
    var right = closest <= this.key.tolerance + slack;
    if (!right && this.state !== "right") {
      // Off only by rounding early: said so, and no try is used (content/README.md, near_miss).
      if (closest <= near + slack) {
        this.say("near-miss", MESSAGES.nearMiss);
        return;
      }
    }
    // Two readings (a comma before three digits) on either side of the key are wrong both ways:
    // the feedback says which way each is off.
    var high = readings[0] > key;
    var split = readings.length > 1 && readings[1] > key !== high;
    var help = high ? "Too high." : "Too low.";
    if (split) help = MESSAGES.eitherWay(parsed.texts[high ? 1 : 0], parsed.texts[high ? 0 : 1]);
    this.answerWith(right, null, right ? "" : help);
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

