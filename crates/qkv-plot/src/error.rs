//! The typed error every figure function returns on bad input or a failed render.

/// Why a figure could not be drawn. Input errors name the offending argument
/// (the field of the figure's input type) and the sizes involved.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum PlotError {
    /// A list or matrix that must hold data holds none.
    #[error("`{arg}` is empty: the figure needs at least one value")]
    Empty {
        /// The argument that is empty.
        arg: &'static str,
    },
    /// A matrix whose rows do not all have the same length.
    #[error("`{arg}` is ragged: row {row} has {len} values but row 0 has {expected}")]
    Ragged {
        /// The matrix argument.
        arg: &'static str,
        /// The first row whose length differs from row 0.
        row: usize,
        /// That row's length.
        len: usize,
        /// Row 0's length.
        expected: usize,
    },
    /// A list whose length must match another argument's size.
    #[error("`{arg}` has {len} entries but `{other}` needs {expected}")]
    LengthMismatch {
        /// The argument with the wrong length.
        arg: &'static str,
        /// Its length.
        len: usize,
        /// The argument that fixes the expected length.
        other: &'static str,
        /// The expected length.
        expected: usize,
    },
    /// A NaN or infinite value where a number must be drawn.
    #[error("`{arg}` has the non-finite value {value} at {at}")]
    NonFinite {
        /// The argument holding the value.
        arg: &'static str,
        /// Where in the argument, e.g. `row 1, column 2` or `index 5`.
        at: String,
        /// The offending value.
        value: f64,
    },
    /// An index (such as the highlighted row) outside its matrix.
    #[error("`{arg}` is {index} but there are only {len} rows (0..{len})")]
    OutOfRange {
        /// The index argument.
        arg: &'static str,
        /// The index given.
        index: usize,
        /// The number of valid positions.
        len: usize,
    },
    /// A zero or negative value on a logarithmic axis.
    #[error("`{arg}` has {value} at {at}, but a logarithmic axis needs values above 0")]
    NotPositive {
        /// The argument holding the value.
        arg: &'static str,
        /// Where in the argument.
        at: String,
        /// The offending value.
        value: f64,
    },
    /// A negative value where a length from zero (a bar) must be drawn.
    #[error("`{arg}` has {value} at {at}, but a bar needs a value of 0 or more")]
    Negative {
        /// The argument holding the value.
        arg: &'static str,
        /// Where in the argument.
        at: String,
        /// The offending value.
        value: f64,
    },
    /// A value range that is not finite and increasing.
    #[error("`{arg}` is ({lo}, {hi}), which is not a finite increasing range")]
    BadRange {
        /// The range argument.
        arg: &'static str,
        /// Its lower end.
        lo: f64,
        /// Its upper end.
        hi: f64,
    },
    /// More decimals than a figure can show.
    #[error("`decimals` is {decimals} but at most {max} can be shown")]
    TooManyDecimals {
        /// The requested number of decimals.
        decimals: usize,
        /// The largest supported number.
        max: usize,
    },
    /// A figure size too small to hold the title, axes and labels.
    #[error("size {width}×{height} px is too small: the figure needs at least {min_width}×{min_height} px")]
    TooSmall {
        /// Requested width in pixels.
        width: u32,
        /// Requested height in pixels.
        height: u32,
        /// Smallest accepted width.
        min_width: u32,
        /// Smallest accepted height.
        min_height: u32,
    },
    /// A figure size beyond what a course page needs (and the PNG buffer should hold).
    #[error("size {width}×{height} px is too large: at most {max} px on a side")]
    TooLarge {
        /// Requested width in pixels.
        width: u32,
        /// Requested height in pixels.
        height: u32,
        /// Largest accepted side.
        max: u32,
    },
    /// A PNG scale of zero or above the maximum.
    #[error("`png_scale` is {png_scale} but must be 1 to {max}")]
    PngScale {
        /// The requested scale.
        png_scale: u32,
        /// The largest accepted scale.
        max: u32,
    },
    /// The embedded DejaVu Sans font could not be parsed (a broken build).
    #[error("the embedded DejaVu Sans font could not be loaded")]
    Font,
    /// The drawing backend failed while drawing the figure.
    #[error("drawing the {figure} failed: {message}")]
    Draw {
        /// Which figure was being drawn.
        figure: &'static str,
        /// The backend's message.
        message: String,
    },
    /// The PNG encoder failed.
    #[error("encoding the {figure} as PNG failed: {message}")]
    Encode {
        /// Which figure was being encoded.
        figure: &'static str,
        /// The encoder's message.
        message: String,
    },
}
