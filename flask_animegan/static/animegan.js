/* flask-animegan's upload page, enhanced: drop or paste a photo, preview it, convert it
   without leaving the page, compare before and after, download. The page works without
   this file (a plain form post); nothing here loads anything from another site. */
(function () {
  "use strict";

  function initCompare(root) {
    root.classList.add("animegan-compare-ready");
    if (root.dataset.ready) return;
    root.dataset.ready = "1";
    var range = root.querySelector(".animegan-compare-range");
    var before = root.querySelector(".animegan-compare-before");
    function update() {
      // the left part shows the photo, the right part the anime picture
      before.style.clipPath = "inset(0 " + (100 - Number(range.value)) + "% 0 0)";
    }
    range.addEventListener("input", update);
    update();
  }

  // Strength, previewed here with no request: the server's mix (convert/strength.py) per
  // pixel. In CIELAB, a* and b* and the base of L* (the blurred picture's L*) move from the
  // photo's to the result's; the photo's detail fades as (1 - s)^2, the result's comes in as s.
  var WHITE = [0.95047, 1.0, 1.08883];
  var LINEAR = new Float32Array(256);
  for (var v = 0; v < 256; v++) {
    var c = v / 255;
    LINEAR[v] = c <= 0.04045 ? c / 12.92 : Math.pow((c + 0.055) / 1.055, 2.4);
  }
  var STEPS = 4095;
  var ENCODED = new Uint8ClampedArray(STEPS + 1);
  for (var i = 0; i <= STEPS; i++) {
    var l = i / STEPS;
    ENCODED[i] = Math.round(255 * (l <= 0.0031308 ? l * 12.92 : 1.055 * Math.pow(l, 1 / 2.4) - 0.055));
  }

  function companded(t) { return t > 0.008856452 ? Math.cbrt(t) : t / 0.128418549 + 4 / 29; }
  function expanded(f) { return f > 6 / 29 ? f * f * f : 0.128418549 * (f - 4 / 29); }

  // RGBA bytes to L*, a*, b* planes (and only L* when lightOnly)
  function labPlanes(rgba, lightOnly) {
    var n = rgba.length / 4;
    var L = new Float32Array(n), A = lightOnly ? null : new Float32Array(n),
        B = lightOnly ? null : new Float32Array(n);
    for (var p = 0, q = 0; p < n; p++, q += 4) {
      var r = LINEAR[rgba[q]], g = LINEAR[rgba[q + 1]], b = LINEAR[rgba[q + 2]];
      var fy = companded(0.212671 * r + 0.715160 * g + 0.072169 * b);
      L[p] = 116 * fy - 16;
      if (lightOnly) continue;
      A[p] = 500 * (companded((0.412453 * r + 0.357580 * g + 0.180423 * b) / WHITE[0]) - fy);
      B[p] = 200 * (fy - companded((0.019334 * r + 0.119193 * g + 0.950227 * b) / WHITE[2]));
    }
    return { L: L, A: A, B: B };
  }

  function pixelsOf(image, width, height, sigma, crop) {
    var canvas = document.createElement("canvas");
    canvas.width = width;
    canvas.height = height;
    var context = canvas.getContext("2d", { willReadFrequently: true });
    if (sigma) context.filter = "blur(" + sigma + "px)";
    if (crop) context.drawImage(image, crop[0], crop[1], crop[2], crop[3], 0, 0, width, height);
    else context.drawImage(image, 0, 0, width, height);
    return context.getImageData(0, 0, width, height).data;
  }

  function loaded(src) {
    return new Promise(function (resolve, reject) {
      var image = new Image();
      image.onload = function () { resolve(image); };
      image.onerror = reject;
      image.src = src;
    });
  }

  // scope holds the result's figure and its strength form; photoCrop() is the part of
  // the photo the result was made from ([x, y, w, h] or null: all of it)
  function initStrength(scope, photoCrop) {
    var control = scope.querySelector("[data-animegan-strength]");
    if (!control) return null;
    var range = control.querySelector(".animegan-strength-range");
    var shown = control.querySelector(".animegan-strength-value");
    var canvas = scope.querySelector(".animegan-strength-canvas");
    var result = scope.querySelector(".animegan-converted");
    var original = scope.querySelector(".animegan-compare-before");
    var prepared = null;
    var pending = null;

    function prepare() {
      if (!prepared) {
        prepared = Promise.all([loaded(result.dataset.fullSrc || result.src), loaded(original.src)])
          .then(function (images) {
            var w = images[0].naturalWidth, h = images[0].naturalHeight;
            var sigma = Math.max(1, Math.max(w, h) / 256);
            var crop = photoCrop ? photoCrop(images[1]) : null;
            var out = labPlanes(pixelsOf(images[0], w, h, 0, null), false);
            var inp = labPlanes(pixelsOf(images[1], w, h, 0, crop), false);
            canvas.width = w;
            canvas.height = h;
            return { w: w, h: h, out: out, inp: inp,
                     outBase: labPlanes(pixelsOf(images[0], w, h, sigma, null), true).L,
                     inpBase: labPlanes(pixelsOf(images[1], w, h, sigma, crop), true).L };
          });
      }
      return prepared;
    }

    function draw(data, s) {
      var context = canvas.getContext("2d");
      var picture = context.createImageData(data.w, data.h);
      var rgba = picture.data, out = data.out, inp = data.inp;
      var fade = (1 - s) * (1 - s);
      for (var p = 0, q = 0; p < rgba.length / 4; p++, q += 4) {
        var ib = data.inpBase[p], ob = data.outBase[p];
        var L = ib + s * (ob - ib) + fade * (inp.L[p] - ib) + s * (out.L[p] - ob);
        var fy = (L + 16) / 116;
        var fx = fy + (inp.A[p] + s * (out.A[p] - inp.A[p])) / 500;
        var fz = fy - (inp.B[p] + s * (out.B[p] - inp.B[p])) / 200;
        var x = expanded(fx) * WHITE[0], y = expanded(fy), z = expanded(fz) * WHITE[2];
        var rgb = [3.240481 * x - 1.537151 * y - 0.498536 * z,
                   -0.969255 * x + 1.875990 * y + 0.041556 * z,
                   0.055647 * x - 0.204041 * y + 1.057311 * z];
        for (var k = 0; k < 3; k++) {
          rgba[q + k] = ENCODED[Math.round(Math.min(1, Math.max(0, rgb[k])) * STEPS)];
        }
        rgba[q + 3] = 255;
      }
      context.putImageData(picture, 0, 0);
      canvas.hidden = false;
    }

    function update() {
      shown.textContent = range.value + " %";
      control.dispatchEvent(new CustomEvent("animegan-strength", { detail: Number(range.value) }));
      if (pending !== null) return;  // one frame at a time: the newest value wins
      pending = requestAnimationFrame(function () {
        prepare().then(function (data) {
          pending = null;
          draw(data, Number(range.value) / 100);
        }, function () { pending = null; });
      });
    }

    if (!control.dataset.ready) {
      control.dataset.ready = "1";
      control.classList.add("animegan-strength-live");
      range.addEventListener("input", update);
      // the preview needs no request: the form is sent only without JavaScript
      control.addEventListener("submit", function (event) { event.preventDefault(); });
    }
    return {
      reset: function () {  // a new result: full strength, nothing prepared
        prepared = null;
        canvas.hidden = true;
        range.value = 100;
        shown.textContent = "100 %";
      },
      value: function () { return Number(range.value); }
    };
  }

  // the result page: its download asks the server for the same mix of the kept result
  document.querySelectorAll(".animegan-result-page").forEach(function (page) {
    var strength = initStrength(page, null);
    var download = page.querySelector("#animegan-download");
    if (!strength || !download) return;
    page.querySelector("[data-animegan-strength]").addEventListener("animegan-strength", function (event) {
      if (download.href.indexOf("data:") === 0) return;  // an inline page: full strength only
      var url = new URL(download.href, location.href);
      if (event.detail < 100) url.searchParams.set("strength", event.detail);
      else url.searchParams.delete("strength");
      download.href = url.pathname + url.search;
    });
  });

  function stemOf(name) {
    var stem = (name || "").replace(/\.[^.]*$/, "").replace(/[^\w.-]+/g, "_");
    return stem || "photo";
  }

  // the same wording as the page without JavaScript (views.sentence)
  function sentence(message) {
    message = String(message).trim();
    if (message && ".!?".indexOf(message.charAt(message.length - 1)) < 0) message += ".";
    return message.charAt(0).toUpperCase() + message.slice(1);
  }

  function statusMessage(response) {
    var wait = response.headers.get("Retry-After");
    var messages = {
      413: "the photo is too big for this server",
      415: "that file is not a photo this server can read",
      429: "too many conversions from your address" + (wait ? "; try again in " + wait + " s" : ""),
      503: "the server is busy" + (wait ? "; try again in " + wait + " s" : "; try again soon")
    };
    return messages[response.status] || "the conversion failed (HTTP " + response.status + ")";
  }

  document.querySelectorAll("[data-animegan-compare]").forEach(function (root) {
    if (!root.closest("[hidden]")) initCompare(root);
  });

  // A running video job's part converted so far (partial_url: its finished segments
  // joined): played as soon as there is one, and swapped for a longer one when it runs
  // out, from where it was. update(job) after each poll; true once the part has played out.
  function partialPlayer(video) {
    var shown = 0;  // segments in the video's src
    var newest = null;  // the last job seen with more of them
    function load(job) {
      var at = video.currentTime || 0;
      shown = job.segments_done;
      newest = null;
      video.hidden = video.parentNode.hidden = false;
      video.addEventListener("loadedmetadata", function seek() {
        video.removeEventListener("loadedmetadata", seek);
        if (at) video.currentTime = Math.min(at, video.duration || at);
        var playing = video.play();
        if (playing && playing.catch) playing.catch(function () { /* the controls play it */ });
      });
      video.src = job.partial_url;
    }
    video.addEventListener("ended", function () { if (newest) load(newest); });
    if (video.dataset.segments) shown = Number(video.dataset.segments);
    return {
      update: function (job) {
        if (!job.partial_url || job.segments_done <= shown) return;
        newest = job;
        if (!shown || video.ended) load(job);
      },
      idle: function () { return !shown || video.ended || video.paused; },
      reset: function () {
        shown = 0;
        newest = null;
        video.removeAttribute("src");
        video.load();
        video.hidden = video.parentNode.hidden = true;
      }
    };
  }

  // The job's own page: while a part plays, poll here instead of refreshing (a refresh
  // would restart it), and reload for the result once the part has played out.
  var jobSection = document.getElementById("animegan-job");
  var partialVideo = document.getElementById("animegan-job-partial");
  if (jobSection && partialVideo && window.fetch) {
    var pagePlayer = partialPlayer(partialVideo);
    var pageBar = document.getElementById("animegan-job-bar");
    var pageStatus = document.getElementById("animegan-job-status");
    var ended = false;
    var pollPage = function () {
      fetch(jobSection.dataset.jobUrl, { credentials: "same-origin",
                                         headers: { Accept: "application/json" } })
        .then(function (response) { return response.json(); })
        .then(function (job) {
          pageBar.max = Math.max(1, job.frames_total);
          pageBar.value = job.state === "done" ? pageBar.max : job.frames_done;
          pageStatus.textContent = job.state === "running" ?
            job.frames_done + " of " + job.frames_total + " frames" +
            (job.eta_s !== null ? ", about " + Math.round(job.eta_s) + " s left" : "") + "." :
            pageStatus.textContent;
          pagePlayer.update(job);
          ended = job.state !== "queued" && job.state !== "running";
        })
        .catch(function () { /* the next poll tries again */ })
        .then(function () {
          if (ended && pagePlayer.idle()) window.location.reload();
          else setTimeout(pollPage, 2000);
        });
    };
    partialVideo.addEventListener("ended", function () { if (ended) window.location.reload(); });
    setTimeout(pollPage, 2000);
  }

  var form = document.getElementById("animegan-form");
  if (!form || !window.fetch || !window.FormData) return;
  document.documentElement.classList.add("animegan-js");
  if (/Mac|iPhone|iPad/.test(navigator.platform || "")) {
    document.querySelectorAll("[data-animegan-paste-key]").forEach(function (key) {
      key.textContent = "\u2318V";
    });
  }

  var input = document.getElementById("animegan-image");
  var drop = document.getElementById("animegan-drop");
  var preview = document.getElementById("animegan-preview");
  var button = document.getElementById("animegan-submit");
  var status = document.getElementById("animegan-status");
  var errorBox = document.getElementById("animegan-error");
  var panel = document.getElementById("animegan-result-panel");
  var faceNote = document.getElementById("animegan-face-note");
  var maxBytes = Number(form.dataset.maxBytes);
  var photo = null;
  var photoUrl = null;
  var resultUrl = null;
  var sentPortrait = "";  // the portrait mode of the conversion last sent

  // The busy indicator's clock. Every end of a conversion stops it *before* writing the
  // status, and a tick checks that its clock still runs, so no late tick can write
  // "Converting... 0.1 s" over the end's status or beside an error.
  var clock = null;

  function startClock() {
    var started = performance.now();
    function elapsed() { return ((performance.now() - started) / 1000).toFixed(1); }
    stopClock("Converting\u2026");
    var id = setInterval(function () {
      if (clock === id) status.textContent = "Converting\u2026 " + elapsed() + " s";
    }, 100);
    clock = id;
    return elapsed;
  }

  function stopClock(text) {
    if (clock !== null) clearInterval(clock);
    clock = null;
    if (text !== undefined) status.textContent = text;
  }

  function showError(message) {
    stopClock("");
    errorBox.textContent = sentence(message);
    errorBox.hidden = false;
    // the box sits above the form: bring it into view and move focus there, so that
    // neither a sighted user scrolled down to the button nor a screen reader misses it
    errorBox.scrollIntoView({ block: "nearest" });
    errorBox.focus({ preventScroll: true });
  }

  function clearError() {
    errorBox.hidden = true;
    errorBox.textContent = "";
  }

  function choose(file) {
    if (!file) return;
    clearError();
    photo = file;
    if (photoUrl) URL.revokeObjectURL(photoUrl);
    photoUrl = URL.createObjectURL(file);
    // shown once the browser could draw it: a file that is not a picture (or one this
    // browser cannot show, such as TIFF) leaves no broken image behind
    preview.hidden = true;
    preview.onload = function () { preview.hidden = false; };
    preview.onerror = function () { preview.hidden = true; preview.removeAttribute("src"); };
    preview.src = photoUrl;
    if (file.size > maxBytes) {
      showError("this photo is " + (file.size / 1048576).toFixed(1) + " MiB; the limit is " +
                form.dataset.maxBytesText);
    }
  }

  function adopt(files) {
    // keep the file input in step, so the form's own validation and a plain post agree
    try { input.files = files; } catch (ignored) { /* old browsers: photo is kept anyway */ }
    choose(files[0]);
  }

  input.addEventListener("change", function () { choose(input.files[0]); });

  ["dragenter", "dragover"].forEach(function (type) {
    drop.addEventListener(type, function (event) {
      event.preventDefault();
      drop.classList.add("animegan-dragging");
    });
  });
  ["dragleave", "drop"].forEach(function (type) {
    drop.addEventListener(type, function () { drop.classList.remove("animegan-dragging"); });
  });
  drop.addEventListener("drop", function (event) {
    event.preventDefault();
    if (event.dataTransfer.files.length) adopt(event.dataTransfer.files);
  });

  document.addEventListener("paste", function (event) {
    var items = (event.clipboardData && event.clipboardData.files) || [];
    if (!items.length) return;
    event.preventDefault();
    var transfer = new DataTransfer();
    var file = items[0];
    transfer.items.add(file.name && file.name !== "image.png" ? file :
      new File([file], "pasted-photo." + (file.type.split("/")[1] || "png"), { type: file.type }));
    adopt(transfer.files);
  });

  function updateFaceNote() {
    var checked = form.querySelector("input[name=style]:checked");
    faceNote.hidden = !(checked && checked.dataset.face === "1");
  }
  if (faceNote) {  // on the page only when a face style is installed
    form.addEventListener("change", updateFaceNote);
    updateFaceNote();
  }

  // What portrait mode and the colour option did (views.describe_options says the same).
  function describeOptions(response) {
    var parts = [];
    var faces = response.headers.get("X-Faces");
    if (faces === "0") {
      parts.push("No face was found" + (response.headers.get("X-AnimeGAN-Face-Crop") === "centre-square" ?
        ": the centre square was converted, as the face styles expect" : "") + ".");
    } else if (faces !== null) {
      parts.push(faces + " face" + (faces === "1" ? "" : "s") + " found and converted on their own.");
    }
    var colors = response.headers.get("X-AnimeGAN-Colors");
    if (colors === "luma") parts.push("The photo's brightness was kept.");
    if (colors === "keep") parts.push("The photo's colours were kept.");
    return parts.join(" ");
  }

  // The photo under the slider as the result shows it: the whole picture, or its centre
  // square (the CSS's object-fit: cover), or with portrait=faces its faces side by side,
  // drawn from the matrices the server sends; on a cache hit, which has none, no slider.
  function showBefore(response, result) {
    var root = panel.querySelector("[data-animegan-compare]");
    var before = root.querySelector(".animegan-compare-before");
    var crops = JSON.parse(response.headers.get("X-AnimeGAN-Face-Crops") || "null");
    var sheet = Number(response.headers.get("X-Faces")) > 0 && sentPortrait === "faces";
    function compare(src) {
      if (src) {
        before.src = src;
        initCompare(root);
      } else {
        root.classList.remove("animegan-compare-ready");  // "The photo you sent" shows instead
      }
    }
    if (!sheet) return compare(photoUrl);
    compare(null);
    if (!crops) return;
    var source = new Image();
    source.src = photoUrl;
    Promise.all([source.decode(), result.decode()]).then(function () {
      var side = result.naturalHeight;
      var width = source.naturalWidth, height = source.naturalHeight;
      var canvas = document.createElement("canvas");
      canvas.width = side * crops.length;
      canvas.height = side;
      var context = canvas.getContext("2d");
      context.fillRect(0, 0, canvas.width, canvas.height);  // black beyond the photo, as there
      crops.forEach(function (m, i) {  // photo (x, y) in fractions -> square (u, v)
        context.save();
        context.beginPath();
        context.rect(i * side, 0, side, side);
        context.clip();
        context.setTransform(m[0] * side / width, m[3] * side / width, m[1] * side / height,
                             m[4] * side / height, m[2] * side + i * side, m[5] * side);
        context.drawImage(source, 0, 0);
        context.restore();
      });
      if (resultUrl === result.src) compare(canvas.toDataURL("image/jpeg", 0.92));
    }, function () { /* a photo this browser cannot draw: no slider */ });
  }

  // the strength slider previews in the page; a download below 100 % asks the server for
  // the same mix of its cached result (a cache hit: no conversion, no rate-limit point)
  var faceCrop = false;
  var sentBody = null;
  var strength = initStrength(panel, function (image) {
    if (!faceCrop) return null;
    var side = Math.min(image.naturalWidth, image.naturalHeight);
    return [(image.naturalWidth - side) / 2, (image.naturalHeight - side) / 2, side, side];
  });
  panel.querySelector("#animegan-download").addEventListener("click", function (event) {
    var percent = strength.value();
    if (percent >= 100 || !sentBody) return;  // the full-strength result, as it came
    event.preventDefault();
    var link = event.currentTarget;
    var body = new FormData();
    sentBody.forEach(function (value, key) { body.append(key, value); });
    body.set("strength", percent);
    status.textContent = "Preparing the download at " + percent + " %\u2026";
    fetch(form.dataset.convertUrl, { method: "POST", body: body, credentials: "same-origin",
                                     headers: { Accept: "application/json" } })
      .then(function (response) {
        if (!response.ok) throw new Error(statusMessage(response));
        return response.blob();
      })
      .then(function (blob) {
        var save = document.createElement("a");
        save.href = URL.createObjectURL(blob);
        save.download = link.download.replace(/(\.[^.]*)$/, "-" + percent + "$1");
        document.body.appendChild(save);
        save.click();
        save.remove();
        setTimeout(function () { URL.revokeObjectURL(save.href); }, 60000);
        status.textContent = "Downloaded at " + percent + " % strength.";
      })
      .catch(function (problem) { showError(problem.message || "the download failed"); });
  });

  function showResult(blob, response, elapsed, body) {
    var style = response.headers.get("X-AnimeGAN-Style") || "anime";
    var ext = { "image/jpeg": "jpg", "image/png": "png", "image/webp": "webp" }[blob.type] || "jpg";
    if (resultUrl) URL.revokeObjectURL(resultUrl);
    resultUrl = URL.createObjectURL(blob);
    var result = panel.querySelector("#animegan-result");
    result.onload = function () {
      panel.querySelector(".animegan-caption").textContent =
        style + ", " + result.naturalWidth + "\u00d7" + result.naturalHeight;
    };
    result.alt = "The photo in the " + style + " style";
    panel.querySelectorAll(".animegan-converted").forEach(function (img) {
      img.src = resultUrl;
      img.dataset.fullSrc = resultUrl;
    });
    faceCrop = response.headers.get("X-AnimeGAN-Face-Crop") === "centre-square";
    sentBody = body;
    strength.reset();
    panel.querySelector(".animegan-photo-sent .animegan-original").src = photoUrl;
    var note = panel.querySelector("#animegan-result-note");
    note.textContent = describeOptions(response);
    note.hidden = !note.textContent;
    var download = panel.querySelector("#animegan-download");
    download.href = resultUrl;
    download.download = stemOf(photo.name) + "-" + style + "." + ext;
    panel.hidden = false;
    showBefore(response, result);
    // a cache hit takes no time: say why, rather than a bare "Done in 0.0 s."
    stopClock("Done in " + elapsed + " s" + (response.headers.get("X-Cache") === "HIT" ?
      ": this photo was converted here before with these options, so the result came " +
      "from the cache." : "."));
    panel.focus();
  }

  // Animations and videos run as jobs (POST .../jobs, then polled); a still photo is
  // converted at once (POST .../convert). The file's type only picks the first try: the
  // server's 415 names the other endpoint (jobs_url or convert_url) when it was wrong.
  var jobPanel = document.getElementById("animegan-job-panel");
  var jobBar = document.getElementById("animegan-job-bar");
  var jobStatus = document.getElementById("animegan-job-status");
  var jobCancel = document.getElementById("animegan-job-cancel");
  var jobUrl = null;
  var POLL_MS = 1000;

  function movesByType(file) {
    return /^video\//.test(file.type) || file.type === "image/gif" || file.type === "image/apng";
  }

  // a photo that runs in tiles is a job too: its progress is in tiles, not frames
  function describeTiles(job) {
    var tiles = job.tiles_done + " of " + job.tiles_total + " tiles";
    if (job.state === "queued") return "Waiting for a worker\u2026 " + job.tiles_total + " tiles to convert.";
    if (job.state === "running" && !job.tiles_total) return "Reading the photo\u2026";
    if (job.state === "running") {  // the tile being converted
      return "Tile " + Math.min(job.tiles_done + 1, job.tiles_total) + " of " + job.tiles_total +
        (job.eta_s !== null ? ", about " + Math.round(job.eta_s) + " s left" : "") + ".";
    }
    if (job.state === "done") return "Done: " + job.tiles_total + " tiles.";
    return (job.state === "cancelled" ? "Cancelled after " : "Stopped after ") + tiles + ".";
  }

  function describeJob(job) {
    if (job.kind === "photo") return describeTiles(job);
    var frames = job.frames_done + " of " + job.frames_total + " frames";
    if (job.state === "queued" && job.waiting_message) return sentence(job.waiting_message);
    if (job.state === "queued") return "Waiting for a worker\u2026 " + job.frames_total + " frames to convert.";
    if (job.state === "running") {
      return frames + (job.eta_s !== null ? ", about " + Math.round(job.eta_s) + " s left" : "") + ".";
    }
    if (job.state === "done") return "Done: " + frames + ".";
    return (job.state === "cancelled" ? "Cancelled after " : "Stopped after ") + frames + ".";
  }

  var jobPartial = document.getElementById("animegan-job-partial");
  var panelPlayer = jobPartial ? partialPlayer(jobPartial) : null;

  function showJob(job) {
    jobPanel.hidden = false;
    if (panelPlayer && job.state !== "done") panelPlayer.update(job);
    var photoJob = job.kind === "photo";
    jobBar.max = Math.max(1, photoJob ? job.tiles_total : job.frames_total);
    jobBar.value = job.state === "done" ? jobBar.max : (photoJob ? job.tiles_done : job.frames_done);
    jobBar.setAttribute("aria-label", photoJob ? "Tiles converted" : "Frames converted");
    document.getElementById("animegan-job-panel-title").textContent =
      photoJob ? "Your large photo" : "Your animation or video";
    jobBar.textContent = Math.round(job.progress * 100) + " %";
    jobStatus.textContent = describeJob(job);
    jobPanel.dataset.state = job.state;
  }

  function showJobResult(job) {
    if (panelPlayer) panelPlayer.reset();  // the whole result takes its place
    var image = document.getElementById("animegan-job-image");
    var video = document.getElementById("animegan-job-video");
    var shown = job.kind === "video" ? video : image;
    (job.kind === "video" ? image : video).hidden = true;
    if (job.kind === "video") video.poster = job.preview_url;
    else image.alt = "The " + (job.kind === "photo" ? "photo" : "animation") + " in the " + job.style + " style";
    image.classList.toggle("animegan-job-photo", job.kind === "photo");
    shown.src = job.result_url;
    shown.hidden = false;
    jobPanel.querySelector(".animegan-job-result").hidden = false;
    var download = document.getElementById("animegan-job-download");
    var ext = { "image/jpeg": "jpg", "image/gif": "gif", "image/webp": "webp", "image/png": "png", "video/mp4": "mp4" };
    download.href = job.download_url;
    download.download = stemOf(photo.name) + "-" + job.style + "." + (ext[job.result_mimetype] || "bin");
    download.hidden = false;
    if (job.error) jobStatus.textContent = sentence(job.error);  // a result that ends early says why
    jobCancel.hidden = true;
    jobPanel.focus();
  }

  function resetJob() {
    jobUrl = null;
    if (panelPlayer) panelPlayer.reset();
    jobPanel.hidden = true;
    jobPanel.querySelector(".animegan-job-result").hidden = true;
    document.getElementById("animegan-job-download").hidden = true;
    jobCancel.hidden = false;
  }

  function pollJob(url, finish) {
    jobUrl = url;
    function tick() {
      if (jobUrl !== url) return finish();  // another file was sent since
      fetch(url, { credentials: "same-origin", headers: { Accept: "application/json" } })
        .then(function (response) {
          return response.json().then(function (job) {
            if (!response.ok) throw new Error(job.error || statusMessage(response));
            return job;
          });
        })
        .then(function (job) {
          showJob(job);
          if (job.state === "done") { showJobResult(job); finish(); }
          else if (job.state === "failed" || job.state === "cancelled") {
            jobCancel.hidden = true;
            if (job.error) showError(job.error);
            finish();
          } else setTimeout(tick, POLL_MS);
        })
        .catch(function (problem) {
          showError(problem && problem.message ? problem.message :
                    "the server could not be reached; check your connection and try again");
          finish();
        });
    }
    tick();
  }

  jobCancel.addEventListener("click", function () {
    if (!jobUrl) return;
    jobCancel.disabled = true;
    fetch(jobUrl, { method: "DELETE", credentials: "same-origin", headers: { Accept: "application/json" } })
      .catch(function () { /* the next poll says how it ended */ })
      .then(function () { jobCancel.disabled = false; });
  });

  form.addEventListener("submit", function (event) {
    event.preventDefault();
    clearError();
    if (!photo) { showError("choose a photo first"); return; }
    if (photo.size > maxBytes) {
      showError("this photo is too big; the limit is " + form.dataset.maxBytesText);
      return;
    }
    var body = new FormData(form);
    body.set("image", photo, photo.name || "photo");
    sentPortrait = body.get("portrait") || "";
    var elapsed = startClock();
    button.disabled = true;
    form.setAttribute("aria-busy", "true");
    form.classList.add("animegan-busy");
    resetJob();
    panel.hidden = true;

    function finish() {
      stopClock();
      button.disabled = false;
      form.removeAttribute("aria-busy");
      form.classList.remove("animegan-busy");
    }

    function send(url, retried) {
      return fetch(url, { method: "POST", body: body, credentials: "same-origin",
                          headers: { Accept: "application/json" } })
        .then(function (response) {
          if (response.status === 202) {
            stopClock("");
            return response.json().then(function (job) {
              showJob(job);
              pollJob(response.headers.get("Location") || job.url, finish);
            });
          }
          if (response.ok) {
            return response.blob().then(function (blob) {
              showResult(blob, response, elapsed(), body);
              finish();
            });
          }
          return response.json().then(
            function (answer) {
              var other = answer.jobs_url || answer.convert_url;
              if (response.status === 415 && other && !retried) return send(other, true);
              showError(answer.error || statusMessage(response));
              finish();
            },
            function () { showError(statusMessage(response)); finish(); });
        });
    }

    send(movesByType(photo) ? form.dataset.jobsUrl : form.dataset.convertUrl, false)
      .catch(function () {
        showError("the server could not be reached; check your connection and try again");
        finish();
      });
  });
})();
