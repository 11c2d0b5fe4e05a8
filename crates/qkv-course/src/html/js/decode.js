  /* ---------- decode-stepper widgets ---------- */

  /* The build wrote every step as the page shows it (data-qkv-data: per step its title, the
   * cache's rows, the output and what to announce), so stepping only swaps them in: every
   * number shown is the engine's. */
  function setupDecode(root) {
    var data = json(root, "script[data-qkv-data]");
    var prev = root.querySelector("[data-qkv-prev]");
    var next = root.querySelector("[data-qkv-next]");
    if (!data || !prev || !next) return;
    var announce = root.querySelector("[data-qkv-announce]");
    stepButtons(prev, next, data.start, data.steps.length - 1, function (i) {
      var step = data.steps[i];
      root.querySelector("[data-qkv-step-title]").innerHTML = step.title;
      root.querySelector("[data-qkv-cache]").innerHTML = step.rows;
      root.querySelector("[data-qkv-output]").innerHTML = step.output;
      announce.textContent = step.announce;
      root.setAttribute("data-qkv-step", step.token);
    }, announce);
  }

  /* A stepper's "Previous" and "Next" buttons (decode-stepper and gradient-descent widgets):
   * `show(i)` writes step i, from `start`. The buttons stay focusable at either end
   * (aria-disabled), so the focus never drops to the page; one pressed at its end says so in
   * `announce`, the widget's live region, which would otherwise say nothing. */
  function stepButtons(prev, next, start, last, show, announce) {
    var at = start;
    var said = "";
    function state() {
      prev.setAttribute("aria-disabled", at === 0 ? "true" : "false");
      next.setAttribute("aria-disabled", at === last ? "true" : "false");
    }
    function move(by) {
      if (at + by < 0 || at + by > last) {
        var text = by > 0 ? "This is the last step." : "This is the first step.";
        // The same words again would not be read again: a no-break space tells them apart.
        said = said === text ? text + "\u00a0" : text;
        announce.textContent = said;
        return;
      }
      at += by;
      show(at);
      state();
    }
    prev.addEventListener("click", function () {
      move(-1);
    });
    next.addEventListener("click", function () {
      move(1);
    });
    prev.parentNode.hidden = false;
    state();
  }

  WIDGETS["decode-stepper"] = setupDecode;
