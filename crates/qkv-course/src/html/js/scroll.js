  /* ---------- scroll boxes: a box wider than the column says so in words, since its last
   * column may end exactly at the edge and look whole ---------- */

  function setupScrollHints() {
    var boxes = Array.prototype.slice.call(document.querySelectorAll(".scroll"));
    function mark(box) {
      if (box.scrollWidth - box.clientWidth > 1) box.setAttribute("data-qkv-more", "");
      else box.removeAttribute("data-qkv-more");
    }
    boxes.forEach(mark);
    // A widget's readouts change their width as it runs, and so does the column with the window.
    if (window.ResizeObserver) {
      var observer = new ResizeObserver(function () {
        boxes.forEach(mark);
      });
      boxes.forEach(function (box) {
        observer.observe(box);
        if (box.firstElementChild) observer.observe(box.firstElementChild);
      });
    } else {
      window.addEventListener("resize", function () {
        boxes.forEach(mark);
      });
    }
  }

  FEATURES.push(setupScrollHints);
